"""Results files as hcp_post.py reads them: unfinished, unreadable or damaged ones are refused.
A finished file carries /checksums (uint8 text, one line per numeric dataset "/path hex" and per
numeric attribute "/path@name hex"): hex is the sum, modulo 2^64, over the values as doubles in C
order of splitmix64(bits(v_i) ^ splitmix64(i)), as the drivers write it. Files written before the
manifest covered every object's attributes list those of /summary only; a manifest that lists any
other attribute must list every numeric attribute of the file."""
import h5py
import numpy as np


class Damaged(Exception):
    """A results file whose contents differ from its /checksums manifest."""


def _mix64(x):
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic), as the writer's mix64."""
    x = x + np.uint64(0x9e3779b97f4a7c15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
    return x ^ (x >> np.uint64(31))


def _checksum(values):
    v = np.ascontiguousarray(np.asarray(values, dtype=np.float64).ravel())
    with np.errstate(over="ignore"):
        keyed = v.view(np.uint64) ^ _mix64(np.arange(v.size, dtype=np.uint64))
        return f"{int(_mix64(keyed).sum(dtype=np.uint64)):016x}"


def verify(path):
    """Raises Damaged unless every numeric dataset and every numeric /summary attribute of the file
    matches its line in /checksums (written by the run when the file was complete)."""
    with h5py.File(path, "r") as f:
        if "checksums" not in f:
            raise Damaged("it has no /checksums (not written by this version of the drivers, or damaged)")
        listed = {}
        for line in bytes(np.asarray(f["checksums"][()], dtype=np.uint8)).decode(errors="replace").split("\n"):
            if line.strip():
                name, _, value = line.rpartition(" ")
                listed[name] = value
        present = []
        f.visititems(lambda n, o: present.append("/" + n) if isinstance(o, h5py.Dataset) and n != "checksums"
                     and o.dtype.kind in "fiu" else None)
        for name in present:
            if name not in listed:
                raise Damaged(f"dataset {name} is not in its /checksums")
        if any("@" in n and not n.startswith("/summary/") for n in listed):
            objects = [("/", f)]
            f.visititems(lambda n, o: objects.append(("/" + n, o)) if n != "checksums" else None)
            for path, obj in objects:
                for attr, value in obj.attrs.items():
                    key = f"{path}@{attr}"
                    if np.asarray(value).dtype.kind in "fiu" and key not in listed:
                        raise Damaged(f"attribute {key} is not in its /checksums")
        for name, want in listed.items():
            obj, _, attr = name.partition("@")
            if obj not in f or (attr and attr not in f[obj].attrs):
                raise Damaged(f"{name} listed in /checksums is missing")
            got = _checksum(f[obj].attrs[attr] if attr else f[obj][()])
            if got != want:
                raise Damaged(f"{'attribute' if attr else 'dataset'} {name} fails its checksum ({got} != {want})")
        _check_ranges(f)


# /config's counts as post-processing reads them: whole numbers of at least this value.
_CONFIG_COUNTS = {"cp_size": 1, "world_size": 1, "cp_inner": 1, "ranks_per_node": 1, "node_cores": 1, "tokens": 0}


def _check_ranges(f):
    if "config" not in f:
        return
    for key, low in _CONFIG_COUNTS.items():
        if key in f["config"].attrs:
            v = np.asarray(f["config"].attrs[key])
            if v.dtype.kind in "fiu" and not (v.size == 1 and np.isfinite(v).all() and float(v) == int(v)
                                                and int(v) >= low):
                raise Damaged(f"/config@{key} = {v.tolist()} is not a whole number >= {low}")


def unusable(path):
    """Why a results file cannot be used (unfinished, unreadable, damaged), or None."""
    if ".tmp-" in path.rsplit("/", 1)[-1]:
        return f"'{path}' is an unfinished results file (a run writes <out>.tmp-<pid> and renames it when complete)"
    try:
        verify(path)
    except OSError as e:
        return f"cannot read HDF5 file '{path}': {e}"
    except Damaged as e:
        return f"'{path}' is damaged: {e}"
    return None
