"""Model, data-set and policy names for the bench and the commands: no TensorFlow here."""

# The command line reads them (--help, and every argument error) before TensorFlow
# loads; `tf_mixed.bench.models`, `tf_mixed.commands.data` and `tf_mixed.bench.config`
# use the same ones.

from __future__ import annotations

from tf_mixed._internal.cli_errors import UsageError, did_you_mean, unknown
from tf_mixed._internal.facts import POLICY_ALIASES
from tf_mixed.policy import POLICY_NAMES

MODEL_NAMES: tuple[str, ...] = ("mlp", "cnn", "resnet18", "resnet50", "mobilenetv2",
                                 "efficientnetb0", "transformer")
SEQUENCE_MODELS = ("transformer",)  # take token sequences, not images
DATA_ACCEPTED = ("shapes, tfds:NAME[:SPLIT] (e.g. tfds:mnist or tfds:cifar10:train), folder:PATH, "
                 "tokens (for --model=transformer)")
SHAPES = "shapes"
TOKENS = "tokens"
DEFAULT_SHAPES_SIZE = 32
MIN_SHAPES_SIZE = 16
DEFAULT_SHAPES_TRAIN = 8000
# Bench-only policy names: what the run computes in, and what it adds.
# "float8": Keras float8 (tf_mixed.float8.quantize) on bfloat16 compute.
# "plan": tf_mixed.plan's per-layer precisions on the float32 model
# (tf_mixed.bench.plan_row), applied with tf_mixed.convert.
# "auto-checked": enable("auto")'s host choice, trained with LossScaleMonitor, whose
# check on the model's own first steps keeps it or moves the model to float32
# (tf_mixed.policy.model_check); its row says which, with the figures.
BENCH_POLICIES = {"float8": "mixed_bfloat16", "plan": "float32", "auto-checked": "auto"}


def check_model(name: object) -> str:
    """Returns the canonical model name.

    Raises:
        UsageError: If ``name`` is not one of `MODEL_NAMES`.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in MODEL_NAMES:
        raise unknown("model", name, "model", list(MODEL_NAMES))
    return key


def check_policy(name: object, flag: str = "policies") -> str:
    """Returns ``name`` lower-cased once it is a policy the bench knows (aliases kept).

    Args:
        name: A policy name as given.
        flag: The flag it came from, for the message ("policies" or "policy").

    Raises:
        UsageError: If ``name`` is neither in `tf_mixed.policy.POLICY_NAMES` nor in
            `BENCH_POLICIES`.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in POLICY_NAMES and key not in BENCH_POLICIES:
        raise unknown(flag, name, "policy", list(POLICY_NAMES) + list(BENCH_POLICIES))
    return key


def canonical(name: str) -> str:
    """``name`` (a checked policy: `check_policy`) in canonical form: an alias
    resolved ("bf16" -> "mixed_bfloat16"), "auto" and bench-only names as given."""
    key = name.strip().lower()
    return POLICY_ALIASES.get(key, key)


def parse_spec(spec: object) -> tuple[str, str, str]:
    """Splits a ``--dataset`` value into ``(kind, name_or_path, split)``.

    Args:
        spec: ``"shapes"``, ``"tokens"``, ``"tfds:NAME[:SPLIT]"`` or ``"folder:PATH"``.

    Returns:
        ``("shapes", "", "")``, ``("tokens", "", "")``, ``("tfds", NAME, SPLIT or
        "train")`` or ``("folder", PATH, "")``.

    Raises:
        UsageError: For any other form.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UsageError("dataset", spec, "empty data set name", DATA_ACCEPTED)
    spec = spec.strip()
    if spec.lower() in (SHAPES, "synthetic"):
        return SHAPES, "", ""
    if spec.lower() == TOKENS:
        return TOKENS, "", ""
    kind, sep, rest = spec.partition(":")
    kind = kind.lower()
    if sep and kind == "tfds":
        name, _, split = rest.partition(":")
        if not name:
            raise UsageError("dataset", spec, "no TFDS name after 'tfds:'", DATA_ACCEPTED)
        return "tfds", name, split or "train"
    if sep and kind == "folder":
        if not rest:
            raise UsageError("dataset", spec, "no path after 'folder:'", DATA_ACCEPTED)
        return "folder", rest, ""
    raise UsageError("dataset", spec, "unknown data set", DATA_ACCEPTED,
                     did_you_mean(spec, (SHAPES, TOKENS)))
