"""MkDocs hook: the pipeline's committed results (``reports/``) are part of the site.

The pages link to the reports where they are in the repository — ``../reports/fed_distance/privacy_attack.md``
from ``docs/privacy.md`` — so that the links work on disk and in a repository browser. For the site, this hook

* adds every file under ``reports/`` to the build, at ``reports/…`` (the tables' ``.md`` files become pages,
  ``reports/index.html`` and the figures are copied as they are), and
* rewrites each Markdown link that leaves ``docs/`` for ``reports/`` into the link to that copy.

Nothing is downloaded and nothing under ``reports/`` is modified. Loaded by ``mkdocs.yml`` (``hooks``).
"""
from __future__ import annotations

import os
import posixpath
import re

from mkdocs.structure.files import File, Files

REPORTS = "reports"
# an inline Markdown link or image target: ](target) or ](target "title")
LINK = re.compile(r"(\]\()(?P<target>[^)\s]+)(?P<rest>(?:\s+\"[^\"]*\")?\))")


def _root(config) -> str:
    return os.path.dirname(os.path.abspath(config.config_file_path))


def on_files(files: Files, config) -> Files:
    root = _root(config)
    for folder, subfolders, names in os.walk(os.path.join(root, REPORTS)):
        subfolders.sort()
        for name in sorted(names):
            path = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
            files.append(File(path, root, config.site_dir, config.use_directory_urls))
    return files


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    root, docs = _root(config), os.path.abspath(config.docs_dir)
    reports = os.path.join(root, REPORTS)
    if not page.file.abs_src_path.startswith(docs + os.sep):
        return markdown  # a report page itself: its links are already relative to reports/
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match) -> str:
        target = match["target"]
        path, hash_, fragment = target.partition("#")
        if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path) or path.startswith("/"):
            return match[0]
        resolved = os.path.normpath(os.path.join(docs, here, path))
        if not (resolved == reports or resolved.startswith(reports + os.sep)):
            return match[0]
        in_site = os.path.relpath(resolved, root).replace(os.sep, "/")
        new = posixpath.relpath(in_site, here or ".") + hash_ + fragment
        return f"{match[1]}{new}{match['rest']}"

    return LINK.sub(rewrite, markdown)
