"""``cso-prepack``: pack a model's filters ahead of time.

    cso-prepack WEIGHTS.npz --spec SPEC.json -o PACKED.npz
    cso-prepack MODEL.onnx -o MODEL.cso [--threads T]

``WEIGHTS.npz`` holds one KCRS filter array per layer.  ``SPEC.json`` maps
each array's name to its convolution::

    {"conv1": {"input_shape": [1, 3, 224, 224], "stride": 2, "padding": 3},
     "fc":    {"input_shape": [1, 512, 7, 7], "bias": "fc_bias"}}

Keys ``stride``, ``padding``, ``dilation`` and ``groups`` take
:func:`cso.conv2d`'s forms and defaults; ``bias`` names another array of
``WEIGHTS.npz`` to pack with the layer.  Progress goes to stderr, the summary
to stdout; any bad input exits with status 1 and a message on stderr.

Given an ONNX model instead (needs ``cso[onnx]``), it makes a
:class:`cso.onnx.InferenceSession` of it and saves the session's packed state
(:meth:`~cso.onnx.InferenceSession.save`): the model and every convolution's
packed filters, which ``InferenceSession("MODEL.cso")`` loads back, validated
as packed filters are.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .untrusted import NpzMembers, UntrustedFileError, read_json_file

_MAX_SPEC_BYTES = 16 * 1024 * 1024
_KEYS = {"input_shape", "stride", "padding", "dilation", "groups", "bias"}


class PrepackError(Exception):
    """A bad input to cso-prepack, with the message the user sees."""


def _load_weights(path):
    try:
        with NpzMembers(path) as members:
            return {name: members.read(name) for name in members.names}
    except FileNotFoundError:
        raise PrepackError(f"{path}: no such file") from None
    except OSError as error:
        raise PrepackError(f"{path}: cannot read ({error})") from None
    except UntrustedFileError as error:
        raise PrepackError(str(error)) from None


def _load_spec(path):
    try:
        spec = read_json_file(path, max_bytes=_MAX_SPEC_BYTES)
    except FileNotFoundError:
        raise PrepackError(f"{path}: no such file") from None
    except OSError as error:
        raise PrepackError(f"{path}: cannot read ({error})") from None
    except UntrustedFileError as error:
        raise PrepackError(f"bad JSON: {error}") from None
    if not isinstance(spec, dict) or not spec:
        raise PrepackError(f"{path}: must be a non-empty JSON object mapping layer names to specs")
    for name, entry in spec.items():
        if not name or "/" in name or name == "__metadata__":
            raise PrepackError(
                f"{path}: layer name {name!r} cannot be stored (it must be non-empty, without "
                "'/', and not '__metadata__'): rename the array"
            )
        if not isinstance(entry, dict) or "input_shape" not in entry:
            raise PrepackError(f"{path}: layer {name!r} needs an object with 'input_shape'")
        unknown = set(entry) - _KEYS
        if unknown:
            raise PrepackError(f"{path}: layer {name!r} has unknown keys {sorted(unknown)}")
        if "bias" in entry and not isinstance(entry["bias"], str):
            raise PrepackError(
                f"{path}: layer {name!r}: 'bias' must be the name of an array in the weights "
                f"file, got {entry['bias']!r}"
            )
    return spec


def _as_param(value):
    # JSON has lists where conv2d takes tuples (nested for padding).
    if isinstance(value, list):
        return tuple(_as_param(item) for item in value)
    return value


def prepack(weights_path, spec_path, output_path, *, progress=None, out=None):
    """Pack every layer of ``spec_path`` from ``weights_path`` into ``output_path``.

    ``progress`` and ``out`` default to the current ``sys.stderr`` and ``sys.stdout``.
    """
    import cso

    progress = sys.stderr if progress is None else progress
    out = sys.stdout if out is None else out

    _check_output(output_path)
    weights = _load_weights(weights_path)
    spec = _load_spec(spec_path)
    biases = {entry["bias"] for entry in spec.values() if "bias" in entry}
    for name, entry in spec.items():
        if name not in weights:
            raise PrepackError(f"layer {name!r} of the spec has no array in {weights_path}")
        if "bias" in entry and entry["bias"] not in weights:
            raise PrepackError(f"bias {entry['bias']!r} of layer {name!r} is not in {weights_path}")
    orphans = sorted(set(weights) - set(spec) - biases)
    if orphans:
        raise PrepackError(f"arrays with no spec entry: {orphans}")
    layers = {}
    started = time.perf_counter()
    for index, (name, entry) in enumerate(spec.items(), 1):
        progress.write(f"[{index}/{len(spec)}] {name} {tuple(weights[name].shape)}\n")
        progress.flush()
        params = {
            key: _as_param(entry[key])
            for key in ("stride", "padding", "dilation", "groups")
            if key in entry
        }
        try:
            layers[name] = cso.pack_filters(
                weights[name],
                _as_param(entry["input_shape"]),
                bias=weights[entry["bias"]] if "bias" in entry else None,
                **params,
            )
        except (TypeError, ValueError) as error:
            raise PrepackError(f"layer {name!r}: {error}") from None
    try:
        cso.save_packed(output_path, layers)
    except OSError as error:
        raise PrepackError(f"{output_path}: cannot write ({error})") from None
    elapsed = time.perf_counter() - started
    panel_bytes = sum(
        p.panels.nbytes + (0 if p.bias is None else p.bias.nbytes) for p in layers.values()
    )
    out.write(
        f"packed {len(layers)} layers, {panel_bytes / 1e6:.2f} MB of panels, "
        f"in {elapsed:.2f} s -> {output_path}\n"
    )
    return layers


def _check_output(path) -> None:
    """Refuse an output path that is a directory, before any work."""
    if os.path.isdir(os.fspath(path)):
        raise PrepackError(f"{path}: is a directory; give the packed file's name")


def prepack_onnx(path, output, threads=None) -> None:
    """Save the packed state of an ONNX model's session (see the module docstring)."""
    try:
        import cso.onnx
    except ImportError:
        raise PrepackError('ONNX models need the onnx package: pip install "cso[onnx]"') from None
    _check_output(output)  # before the session's packing, not after
    started = time.perf_counter()
    try:
        session = cso.onnx.InferenceSession(path, threads=threads)
        session.save(output)
    except (ValueError, TypeError, OSError) as error:
        raise PrepackError(str(error)) from None
    layers = len(session.packed_layers())
    print(
        f"packed {layers} layers (convolutions and matrix products) of {path} into {output} "
        f"in {time.perf_counter() - started:.1f} s"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="cso-prepack", description="Pack convolution filters ahead of time for cso."
    )
    parser.add_argument(
        "weights", help="an .npz with one KCRS filter array per layer, or an ONNX model (.onnx)"
    )
    parser.add_argument("--spec", help="JSON: layer name -> convolution (for an .npz)")
    parser.add_argument("-o", "--output", required=True, help="the packed file to write")
    parser.add_argument(
        "--threads", type=int, default=None, help="workers to plan for (ONNX models; default all)"
    )
    args = parser.parse_args(argv)
    try:
        if args.weights.endswith(".onnx"):
            if args.spec is not None:
                raise PrepackError("--spec is for weights in an .npz, not an ONNX model")
            prepack_onnx(args.weights, args.output, args.threads)
        elif args.spec is None:
            raise PrepackError("--spec is required for weights in an .npz")
        else:
            prepack(args.weights, args.spec, args.output)
    except PrepackError as error:
        print(f"cso-prepack: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
