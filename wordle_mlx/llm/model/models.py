"""Model specs -> local mlx-lm folders -> loaded (model, tokenizer) pairs.

A model spec is one of: `builtin:tiny-random` (a tiny random Gemma 3 for tests), `builtin:gemma-3-270m`
(Gemma 3 270M imported from the bundled GGUF), a `.gguf` file (imported once, cached by path, size and
mtime), a local mlx-lm model folder, or a Hugging Face repo id such as `mlx-community/gemma-3-4b-it-bf16`
(downloaded with the files mlx-lm's loader fetches: `download_model`). Built and imported folders live in the
user cache (`fileio.cache_dir("models")`) and are built in a temporary sibling folder, then renamed into place,
so a crash never leaves a half-written model. `load_model` loads with mlx-lm's own loader (and its LoRA adapter
loader), and on CPU casts half-precision weights to float32, since bf16/fp16 matmuls are far slower there (a
loaded adapter's LoRA weights are float32 in every dtype: `lora.lora_to_float32`), and switches
Gemma 3's GELU to the CPU-friendly form of `cpu_kernels.py` (WORDLE_MLX_EXACT_GELU=1 keeps mlx-lm's).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Iterator

import mlx.core as mx
import mlx_lm.utils as mlx_utils
from mlx.utils import tree_flatten
from mlx_lm.tuner.utils import load_adapters

from ...config import read_json_file
from ...errors import UserError
from ...runtime import device
from ...runtime.device import DTYPES
from ...storage.fileio import cache_dir, publish_dir, write_json_atomic
from . import hub
from .cpu_kernels import use_fast_gelu
from .gguf_import import bundled_gemma_270m_gguf, import_gguf
from .lora import lora_to_float32
from .tiny_model import make_tiny_model_dir

BUILTIN_PREFIX = "builtin:"
BUILTINS = ("tiny-random", "gemma-3-270m")
BUILD_FORMAT_VERSION = 1  # bump when the tiny model or the GGUF import changes
BUILD_MARKER = "wordle_mlx_build.json"
HF_REPO_PATTERN = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def check_dtype(dtype: str | None) -> str:
    dtype = dtype or device.default_dtype()
    if dtype not in DTYPES:
        raise UserError(f"dtype: unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return dtype


@contextlib.contextmanager
def building_dir(target: Path, keep_if: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield an empty temp folder beside `target`; on success rename it to `target`, else delete it.

    If `target` appeared meanwhile and `keep_if(target)` holds (another process finished the same
    build), the new folder is discarded instead.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        for item in tmp.iterdir():
            if item.is_file():
                os.chmod(item, 0o666 & ~umask)
        if target.exists() and keep_if is not None and keep_if(target):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            publish_dir(tmp, target)   # replaces an outdated folder
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_current_build(folder: Path) -> bool:
    """True if `folder` is a finished cached build made by this BUILD_FORMAT_VERSION."""
    try:
        marker = json.loads((folder / BUILD_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("version") == BUILD_FORMAT_VERSION \
        and (folder / "config.json").is_file()


def cached_build(name: str, build: Callable[[Path], object]) -> Path:
    """The cached model folder `name`, built with `build(folder)` the first time it is asked for.

    A marker file records BUILD_FORMAT_VERSION; folders built by an older version are rebuilt.
    """
    target = cache_dir("models") / name
    if is_current_build(target):
        return target
    with building_dir(target, keep_if=is_current_build) as tmp:
        build(tmp)
        write_json_atomic(tmp / BUILD_MARKER, {"version": BUILD_FORMAT_VERSION, "name": name})
    return target


def tiny_random_dir(seed: int = 0) -> Path:
    return cached_build(f"tiny-random-seed{seed}", lambda d: make_tiny_model_dir(d, seed))


def gemma_270m_dir(dtype: str | None = None) -> Path:
    dtype = check_dtype(dtype)
    return cached_build(f"gemma-3-270m-{dtype}", lambda d: import_gguf(bundled_gemma_270m_gguf(), d, dtype=dtype))


def gguf_cache_name(path: Path, dtype: str) -> str:
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    return f"gguf-{path.stem}-{hashlib.sha256(key).hexdigest()[:12]}-{dtype}"


def gguf_dir(path: Path, dtype: str | None = None) -> Path:
    dtype = check_dtype(dtype)
    return cached_build(gguf_cache_name(path, dtype), lambda d: import_gguf(path, d, dtype=dtype))


def resolve_model(spec: str, dtype: str | None = None) -> Path | str:
    """A local mlx-lm model folder for `spec`, or the Hugging Face repo id to let mlx-lm download."""
    spec = str(spec).strip()
    if dtype is not None:
        check_dtype(dtype)
    if not spec:
        raise UserError("model: empty model spec")
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        if name == "tiny-random":
            return tiny_random_dir()
        if name == "gemma-3-270m":
            return gemma_270m_dir(dtype)
        raise UserError(f"model {spec!r}: unknown builtin model; known: "
                        + ", ".join(BUILTIN_PREFIX + b for b in BUILTINS))
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise UserError(f"model {spec!r}: GGUF file not found")
        return gguf_dir(path, dtype)
    if path.exists():
        if not path.is_dir():
            raise UserError(f"model {spec!r}: not a model folder or a .gguf file")
        if not (path / "config.json").is_file():
            raise UserError(f"model {spec!r}: folder has no config.json, so it is not an MLX model folder")
        if not any(path.glob("model*.safetensors")):
            raise UserError(f"model {spec!r}: folder has no model*.safetensors weights")
        return path
    if HF_REPO_PATTERN.match(spec) and not spec.startswith((".", "/", "~")):
        return spec
    raise UserError(f"model {spec!r}: no such folder or file, and not a Hugging Face repo id (owner/name)")


def download_model(location: Path | str, spec: str | None = None, weights: bool = True) -> Path:
    """The folder of a model `resolve_model` located, as mlx-lm's loader finds it: a local folder as it is, a Hub
    id downloaded (or found in the Hugging Face cache) with the files mlx-lm fetches (`DEFAULT_ALLOW_PATTERNS`;
    without `weights`, all but model*.safetensors, as mlx-lm's tokenizer loader does). A Hub refusal (gated, not
    found, no token, offline) is a one-line `UserError` naming `spec` (`hub.py`)."""
    path = Path(str(location))
    if not path.exists():
        patterns = [p for p in mlx_utils.DEFAULT_ALLOW_PATTERNS if weights or not p.endswith(".safetensors")]
        path = hub.download(str(location), spec or str(location), patterns)
    return path


def local_model_folder(location: Path | str) -> Path:
    """The folder of a model `resolve_model` located: a local folder as it is, a Hub id's downloaded snapshot
    (the loader fetched it already, so this does not download)."""
    return Path(location) if Path(location).exists() else mlx_utils.hf_repo_to_path(str(location))


def describe_model_dir(path: Path) -> dict:
    """Where a local model folder is and how big its files are."""
    files = [p for p in Path(path).iterdir() if p.is_file()]
    return {"path": str(path), "files": sorted(p.name for p in files),
            "size_mb": round(sum(p.stat().st_size for p in files) / 1e6, 1)}


def cast_model(model, dtype: str | None) -> None:
    """Cast floating-point parameters: to `dtype` if given; else, where the default dtype is float32 (CPU), to
    float32 if they are half precision, and where it is not (a GPU, or WORDLE_MLX_DEFAULT_DTYPE), keep the model's."""
    if dtype is None:
        if device.default_dtype() != "float32":
            return
        halves = {mx.bfloat16, mx.float16}
        if not any(v.dtype in halves for _, v in tree_flatten(model.parameters())):
            return
        dtype = "float32"
    model.set_dtype(getattr(mx, check_dtype(dtype)))
    mx.eval(model.parameters())


_TOKENIZERS: "OrderedDict[tuple, object]" = OrderedDict()     # the last few tokenizers loaded, see load_tokenizer
KEEP_TOKENIZERS = 2


def load_tokenizer(model_path: Path, eos_token_ids):
    """mlx-lm's tokenizer for a model folder, parsed once per process: Gemma 3's 262k-entry tokenizer.json
    takes seconds to parse, and one eval loads the same tokenizer for the model and the base-model baseline.
    Keyed by the folder, its tokenizer files' sizes and times and the eos ids; nothing here mutates a
    tokenizer (wordle-mlx decodes with `decode`, never the stateful streaming detokenizer)."""
    files = sorted(p for p in Path(model_path).glob("*") if p.is_file() and ("token" in p.name or p.suffix == ".jinja"))
    key = (str(Path(model_path).resolve()), tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files),
           repr(eos_token_ids))
    if key in _TOKENIZERS:
        _TOKENIZERS.move_to_end(key)
        return _TOKENIZERS[key]
    tokenizer = mlx_utils.load_tokenizer(model_path, eos_token_ids=eos_token_ids)
    _TOKENIZERS[key] = tokenizer
    while len(_TOKENIZERS) > KEEP_TOKENIZERS:
        _TOKENIZERS.popitem(last=False)
    return tokenizer


@functools.lru_cache(maxsize=2)
def tokenizer_for(spec: str):
    """The tokenizer of model `spec` alone (a Hub model's tokenizer files are downloaded without its weights),
    loaded once per process."""
    return mlx_utils.load_tokenizer(download_model(resolve_model(spec), spec, weights=False))


def load_model(spec: str, adapter_path: str | os.PathLike | None = None, dtype: str | None = None):
    """Resolve `spec` and load `(model, tokenizer)` with mlx-lm (what `mlx_lm.load` does, with the tokenizer
    from `load_tokenizer`), optionally with a LoRA adapter folder."""
    location = resolve_model(spec, dtype)
    if adapter_path is not None:
        adapter = Path(adapter_path).expanduser()
        for needed in ("adapter_config.json", "adapters.safetensors"):
            if not (adapter / needed).is_file():
                raise UserError(f"adapter {str(adapter_path)!r}: missing {needed}")
    try:
        model_path = download_model(location, spec)     # a local folder as it is, a Hub id downloaded
        model, config = mlx_utils.load_model(model_path)
        tokenizer = load_tokenizer(model_path, config.get("eos_token_id"))
    except (OSError, ValueError) as exc:
        where = "Hugging Face repo" if isinstance(location, str) else "model folder"
        raise UserError(f"model {spec!r}: cannot load {where} {location}: {str(exc).splitlines()[0]}") from None
    except RuntimeError as exc:    # MLX: a truncated or corrupt .safetensors file
        raise UserError(f"model {spec!r}: corrupt weights in {location}: {' '.join(str(exc).split())[:200]} "
                        "(delete the folder to rebuild a cached model)") from None
    # Cast before the adapter goes in: the adapter's float32 weights then load bit for bit (cast after, a bf16
    # model would round them to bf16, a larger change than one SGD step).
    cast_model(model, dtype)
    if adapter_path is not None:
        if not isinstance(read_json_file(adapter / "adapter_config.json"), dict):
            raise UserError(f"{adapter / 'adapter_config.json'}: expected a JSON object")
        try:
            model = load_adapters(model, str(adapter))
        except RuntimeError as exc:    # MLX: a truncated or corrupt adapters.safetensors
            raise UserError(f"{adapter / 'adapters.safetensors'}: unreadable adapter weights: "
                            f"{' '.join(str(exc).split())[:200]}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            detail = " ".join(str(exc).split())[:300]
            raise UserError(f"adapter {str(adapter_path)!r} does not fit model {spec!r}: {detail}") from None
        model.eval()
        lora_to_float32(model)       # an adapter saved in bfloat16 trains and plays in float32
    if not device.has_gpu() and not os.environ.get("WORDLE_MLX_EXACT_GELU"):
        use_fast_gelu(model)
    return model, tokenizer
