"""mkdocs hooks (mkdocs.yml `hooks:`): after the build, every public name has an API entry.

Each module's `__all__` is read from its source (no import, so no JAX start-up); every name in
it must have an anchor `id="<module>.<name>"` on that module's API page, except the submodules,
which have pages of their own. A missing one fails the build with the list.
"""

from __future__ import annotations

import ast
import pathlib

from mkdocs.exceptions import PluginError

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULES = {  # module -> (source file, API page under the site, without its .html)
    "jaxdist": ("jaxdist/__init__.py", "api/jaxdist"),
    "jaxdist.experimental": ("jaxdist/experimental.py", "api/experimental"),
    "jaxdist.nn": ("jaxdist/nn.py", "api/nn"),
    "jaxdist.cluster_resolver": ("jaxdist/cluster_resolver.py", "api/cluster_resolver"),
    "jaxdist.errors": ("jaxdist/errors.py", "api/errors"),
}


def public_names(source: pathlib.Path) -> list[str]:
    """The strings of the module's `__all__` assignment."""
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
    raise PluginError(f"{source} has no __all__")


def on_post_build(config, **kwargs) -> None:  # noqa: ARG001
    site = pathlib.Path(config["site_dir"])
    missing = []
    for module, (source, page) in MODULES.items():
        # mkdocs.yml's use_directory_urls: false builds api/jaxdist.html (true: api/jaxdist/index.html)
        built = f"{page}/index.html" if config["use_directory_urls"] else f"{page}.html"
        html = (site / built).read_text()
        for name in public_names(ROOT / source):
            if f"{module}.{name}" in MODULES:
                continue
            if f'id="{module}.{name}"' not in html:
                missing.append(f"{module}.{name}")
    if missing:
        raise PluginError(f"public names without an API entry: {', '.join(missing)}")
