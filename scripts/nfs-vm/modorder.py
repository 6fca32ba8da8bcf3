"""Print the .ko paths needed for the given modules, dependencies first (no depmod/modinfo here)."""
import os, re, sys
root, wanted = sys.argv[1], sys.argv[2:]
builtin = {os.path.basename(l.strip())[:-3].replace("-", "_") for l in open(os.path.join(root, "modules.builtin"))}
paths = {}
for d, _, files in os.walk(os.path.join(root, "kernel")):
    for f in files:
        if f.endswith(".ko"):
            paths[f[:-3].replace("-", "_")] = os.path.join(d, f)
order, seen = [], set()
def visit(name):
    name = name.replace("-", "_")
    if name in seen or name in builtin:
        return
    seen.add(name)
    data = open(paths[name], "rb").read()
    m = re.search(rb"depends=([^\0]*)", data)
    for dep in (m.group(1).decode().split(",") if m and m.group(1) else []):
        visit(dep)
    order.append(paths[name])
for w in wanted:
    visit(w)
print("\n".join(order))
