"""Join grid_parts/*.json (keras_grid.py's output) into keras_grid.json.

Usage: python3 merge_grid.py   (plain Python; no TF needed)
"""

import glob
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ans = {}
    for path in sorted(glob.glob(os.path.join(HERE, "grid_parts", "*.json"))):
        with open(path) as f:
            ans.update(json.load(f))
    with open(os.path.join(HERE, "keras_grid.json"), "w") as f:
        json.dump(dict(sorted(ans.items())), f)
    print(len(ans), "keys")


if __name__ == "__main__":
    main()
