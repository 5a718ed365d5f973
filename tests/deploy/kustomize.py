"""A small `kustomize build` for the subset deploy/k8s uses: resources, namespace, patches.

Patches are strategic-merge patches (file or inline) matched by kind and name; `$patch: delete`
removes the target; lists of named items (containers, env, volumes, ports) merge by name, other
lists are replaced. Any other kustomization field fails loudly, so a manifest cannot start using
a feature this renderer would silently ignore.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

SUPPORTED_FIELDS = frozenset({"apiVersion", "kind", "namespace", "resources", "patches"})
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass",
                            "CustomResourceDefinition", "RuntimeClass", "StorageClass"})


class KustomizeError(ValueError):
    """The kustomization uses something this renderer does not support, or is inconsistent."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a mapping with a repeated key (YAML allows it; it hides bugs)."""


def _mapping(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *anchor` keys may be overridden by explicit ones
        k = loader.construct_object(key_node, deep=True)
        if k in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {k!r}",
                                                    key_node.start_mark)
        seen.add(k)
    loader.flatten_mapping(node)
    return loader.construct_mapping(node, deep=True)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def load_docs(text: str) -> list[Obj]:
    """Every non-empty YAML document of text; a repeated mapping key is an error."""
    return [doc for doc in yaml.load_all(text, Loader=StrictLoader) if doc is not None]


def key(obj: Obj) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def build(directory: Path) -> list[Obj]:
    """Render the kustomization in `directory` (recursively) into a list of objects."""
    kfile = directory / "kustomization.yaml"
    spec = load_docs(kfile.read_text())[0]
    unknown = sorted(set(spec) - SUPPORTED_FIELDS)
    if unknown:
        raise KustomizeError(f"{kfile}: unsupported field(s) {unknown}")
    objs: list[Obj] = []
    for res in spec.get("resources", []):
        path = (directory / res).resolve()
        objs.extend(build(path) if path.is_dir() else load_docs(path.read_text()))
    for entry in spec.get("patches", []):
        extra = sorted(set(entry) - {"path", "patch"})
        if extra or len(entry) != 1:
            raise KustomizeError(f"{kfile}: a patch must have exactly one of path/patch, got {entry}")
        text = (directory / entry["path"]).read_text() if "path" in entry else entry["patch"]
        for patch in load_docs(text):
            objs = apply_patch(objs, patch, kfile)
    if "namespace" in spec:
        for obj in objs:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = spec["namespace"]
    seen: set[tuple[str, str]] = set()
    for obj in objs:
        if key(obj) in seen:
            raise KustomizeError(f"{kfile}: {key(obj)} defined twice")
        seen.add(key(obj))
    return objs


def apply_patch(objs: list[Obj], patch: Obj, where: Path) -> list[Obj]:
    target = key(patch)
    matches = [i for i, obj in enumerate(objs) if key(obj) == target]
    if len(matches) != 1:
        raise KustomizeError(f"{where}: patch target {target} matches {len(matches)} objects")
    i = matches[0]
    if patch.get("$patch") == "delete":
        return objs[:i] + objs[i + 1:]
    return [*objs[:i], merge(objs[i], patch), *objs[i + 1:]]


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge of `patch` into `base` (new objects; inputs untouched)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for k, v in patch.items():
            if k.startswith("$patch"):
                continue
            if v is None:
                out.pop(k, None)
            else:
                out[k] = merge(out[k], v) if k in out else copy.deepcopy(v)
        return out
    if (isinstance(base, list) and isinstance(patch, list) and patch
            and all(isinstance(x, dict) and "name" in x for x in [*base, *patch])):
        merged = [copy.deepcopy(x) for x in base]
        for item in patch:
            names = [x["name"] for x in merged]
            if item["name"] in names:
                j = names.index(item["name"])
                merged[j] = merge(merged[j], item)
            else:
                merged.append(copy.deepcopy(item))
        return merged
    return copy.deepcopy(patch)
