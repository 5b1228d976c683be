"""Join parts/r{1,2,4,8}.json into keras_answers.json and add sanity figures to "_meta".

Usage: python3 merge.py   (plain numpy; no TF needed)
"""

import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RS = (1, 2, 4, 8)


def flat(ans):
    """Every float of an answer (history, weights, evaluate, predict / result) as one vector."""
    parts = []
    for k in ("history", "evaluate", "result"):
        for name in sorted(ans.get(k, {})):
            parts.append(np.ravel(np.asarray(ans[k][name], np.float64)))
    for k in ("weights",):
        parts += [np.ravel(np.asarray(w, np.float64)) for w in ans.get(k, [])]
    if "predict" in ans:
        parts.append(np.ravel(np.asarray(ans["predict"], np.float64)))
    return np.concatenate(parts)


def maxdiff(a, b, field=None):
    if "error" in a or "error" in b:
        return None
    if field is None:
        return float(np.max(np.abs(flat(a) - flat(b))))
    if field == "weights":
        return float(max(np.max(np.abs(np.asarray(p) - np.asarray(q)))
                         for p, q in zip(a["weights"], b["weights"])))
    return float(np.max(np.abs(np.asarray(a[field], np.float64) - np.asarray(b[field], np.float64))))


def main():
    ans, per_proc = {}, {}
    for r in RS:
        with open(os.path.join(HERE, "parts", f"r{r}.json")) as f:
            part = json.load(f)
        per_proc[f"r{r}"] = part.pop(f"_meta.r{r}")
        ans.update(part)
    m1 = per_proc["r1"]
    meta = {"tf": m1["tf"], "keras": m1["keras"], "numpy": m1["numpy"],
            "backend": "tensorflow", "env": "TF_ENABLE_ONEDNN_OPTS=0, 8 logical CPUs, eager + tf.function",
            "per_process": per_proc}
    # 1. R=1 MirroredStrategy vs no strategy at all.
    meta["r1_vs_nodist_max_abs_diff"] = {
        f"{m}.{o}.plain": maxdiff(ans[f"{m}.{o}.plain.r1"], ans[f"{m}.{o}.plain.nodist"])
        for m in ("dense", "bn", "syncbn") for o in ("sgd", "adam")}
    # 2. each R vs R=1 (weights only, and everything).
    across = {}
    for key in sorted(k for k in ans if k.endswith(".r1") and not k.startswith("_")):
        base = key[:-3]
        across[base] = {f"r{r}": {"weights": maxdiff(ans[f"{base}.r{r}"], ans[key], "weights"),
                                  "all": maxdiff(ans[f"{base}.r{r}"], ans[key])}
                        for r in RS[1:] if f"{base}.r{r}" in ans}
    meta["vs_r1_max_abs_diff"] = across
    # 3. syncbn vs bn at R=1 (should be identical: one replica).
    meta["syncbn_vs_bn_r1_max_abs_diff"] = {
        v: maxdiff(ans[f"syncbn.sgd.{v}.r1"], ans[f"bn.sgd.{v}.r1"]) for v in ("plain", "sw", "val")}
    # 4. tf.data input vs numpy input.
    meta["tfdata_vs_numpy_max_abs_diff"] = {
        f"r{r}": maxdiff(ans[f"dense.sgd.tfdata.r{r}"], ans[f"dense.sgd.plain.r{r}"]) for r in RS}
    # 5. how the 250-row / 58-row / 70-row inputs were split.
    meta["split_sizes"] = {
        f"r{r}": {name: {src: [[len(rep) for rep in b] for b in batches]
                         for src, batches in v.items()}
                  for name, v in ans[f"_split.r{r}"].items()} for r in RS}
    # 5b. the patched-build validation variant vs the plain val variant (where val worked).
    meta["valpatch_vs_val_max_abs_diff"] = {
        f"{m}.r{r}": maxdiff(ans[f"{m}.sgd.valpatch.r{r}"], ans[f"{m}.sgd.val.r{r}"])
        for m in ("dense", "bn", "syncbn") for r in RS}
    meta["partial_batch_scaling"] = {k: ans[k] for k in ans if k.startswith("_partial_batch")}
    meta["evaluate_fresh_uneven_first_batch"] = {
        k: ans[k].get("error", ans[k].get("evaluate"))
        if "error" not in ans[k] else ans[k]["error"][:160]
        for k in ans if k.startswith("_evaluate_fresh")}
    meta["errors"] = {k: v["error"][:200] for k, v in ans.items()
                      if isinstance(v, dict) and "error" in v}
    out = {"_meta": meta}
    out.update(dict(sorted(ans.items())))
    with open(os.path.join(HERE, "keras_answers.json"), "w") as f:
        json.dump(out, f)
    show = {k: v for k, v in meta.items() if k not in ("per_process", "split_sizes", "vs_r1_max_abs_diff")}
    print(json.dumps(show, indent=1))
    print(json.dumps(meta["split_sizes"]))


if __name__ == "__main__":
    main()
