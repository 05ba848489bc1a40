"""MkDocs hook (mkdocs.yml, ``hooks:``): the package's docstrings use Sphinx roles (``:class:`~._handle.RankTrial```),
which mkdocstrings' Google-style parser leaves as text. Show each as the code name it points at."""

import re

_ROLE = re.compile(r":(?:class|func|meth|data|attr|exc|mod|obj):\s*<code>~?\.*(?:[\w]+\.)*([\w]+(?:\(\))?)</code>")


def on_page_content(html, page, config, files):  # noqa: ARG001 (MkDocs' hook signature)
    return _ROLE.sub(r"<code>\1</code>", html).replace(".. note:: ", "Note: ")
