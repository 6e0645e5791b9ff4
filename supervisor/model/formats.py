"""The step lines of common trainers, recognised with no configuration.

Each format below was taken from the trainer's real output (issue threads and the
trainers' own logging code), not guessed:

=================  ===================================================================
name               a real line
=================  ===================================================================
megatron           `` iteration      201/  250000 | consumed samples: ... | lm loss: 2.37E+00 |``
nanogpt            ``iter 1631: loss 4.0863, time 561.94ms, mfu 16.68%``
torchtitan         ``[rank0]:[titan] 2025-03-12 ... - root - INFO - step: 22  loss:  6.2250  memory: ...``
deepspeed          ``[2022-03-11 02:06:58,985] [INFO] [logging.py:69:log_dist] [Rank 0] step=40, skipped=2, ...``
lightning          ``Epoch 0:  22%|██▏       | 4/18 [00:17<01:02,  4.47s/it, loss=10.072, v_num=193315]``
pytorch_examples   ``[GPU0] Epoch 0 | Batchsize: 32 | Steps: 64`` (DDP tutorial), ``Train Epoch: 1 [640/60000 (1%)]\tLoss: 2.30``
tqdm               `` 10%|█         | 50/500 [00:10<01:30,  5.00it/s]`` (Hugging Face Trainer, Accelerate scripts), ``45it [00:05, 8.52it/s]``;
                   only bars with no description or one that says training: ``Map:``, ``Loading checkpoint
                   shards:``, ``Sanity Checking …`` bars come before training and are not steps
plain              ``step 12``, ``Step 12/500``, ``step=12``, ``Step: 12``
=================  ===================================================================

Matching runs on every frame of output, so it is cheap: a frame is searched backwards for
a handful of keywords with ``bytes.rfind`` (C speed, no regex over the whole frame); only
the last few lines that hold a keyword are tried against the formats.  A tqdm bar at 0
(``0/18 [00:00<?, ?it/s]``) is not a step: nothing has been done yet.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Final, TypeVar

from dflashd.supervisor.model.bounds import bounded_int, finite_float

_LINES_TRIED: Final = 4  # keyword lines tried per frame, from the end
_TAIL_LINES: Final = 64  # only a frame's last lines are searched: the latest step is near its end
# colours (torchtitan) and cursor moves
_ANSI_ESCAPE: Final = re.compile(r"\x1b\[[0-9;?]{0,32}[A-Za-z]")
# a loss may be negative (a log-likelihood, a contrastive bound)
_NUM: Final = r"(-?(?:[0-9]{1,30}(?:\.[0-9]{1,30})?(?:[eE][+-]?[0-9]{1,4})?|nan|inf))"
# Matching is linear in the line and bounded: only a line's head is matched, every
# quantifier between literals is bounded, and a digit run can only start where a run
# starts ((?<![0-9])), so no pattern retries a long run from each of its positions.
MAX_MATCH_CHARS: Final = 4096
_SP: Final = r"\s{0,32}"  # spaces between two parts of a step line


@dataclass(frozen=True, slots=True)
class StepLine:
    """A recognised step: the format's name, the step (None when it counts epochs) and the loss."""

    format: str
    step: int | None
    loss: float | None
    epoch: float | None = None  # epochs done, with the fraction where the line gives one
    epoch_index: int | None = None  # an epoch-structured bar: its epoch (0-based)...
    batches: int | None = None  # ...and the epoch's total (``step`` is then the batch in it)
    total: int | None = (
        None  # a tqdm bar's total (an evaluation bar nested in training has its own)
    )


@dataclass(frozen=True, slots=True)
class _Format:
    name: str
    pattern: re.Pattern[str]
    step_group: int | None  # None: the line marks training but carries no global step
    loss_pattern: re.Pattern[str] | None = None
    zero_is_start: bool = False  # a bar at 0 has done nothing yet
    training_desc_only: bool = False  # a bar's description must be empty or say training
    epoch_pattern: re.Pattern[str] | None = None  # an epoch count elsewhere in the line


def _c(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _tqdm(bar: str) -> _Format:
    """A tqdm bar; its description (what precedes it) must be empty or say training."""
    return _Format(
        "tqdm",
        _c(bar),
        1,
        _c(r"\bloss[=:]" + _SP + _NUM),
        zero_is_start=True,
        training_desc_only=True,
    )


FORMATS: Final[tuple[_Format, ...]] = (
    _Format(
        "megatron",
        _c(r"\biteration\s{1,32}([0-9]{1,15})" + _SP + "/" + _SP + r"[0-9]{1,15}" + _SP + r"\|"),
        1,
        _c(r"\blm loss: " + _NUM),
    ),
    _Format("nanogpt", _c(r"\biter ([0-9]{1,15}): loss "), 1, _c(r"\bloss " + _NUM)),
    _Format(
        "torchtitan",
        _c(r"\bstep:" + _SP + r"([0-9]{1,15})\s{1,32}loss:"),
        1,
        _c(r"\bloss:" + _SP + _NUM),
    ),
    # deepspeed.initialize() prints step=0 before any optimizer step: not a step
    _Format(
        "deepspeed",
        _c(r"\[Rank [0-9]{1,9}\] step=([0-9]{1,15}), skipped="),
        1,
        zero_is_start=True,
    ),
    # Hugging Face Trainer's log dict: {'loss': 2.31, ...} (4.x) or {'loss': '2.31', ...} (5.x)
    _Format(
        "hf_trainer",
        _c(r"^\s{0,8}\{['\"]loss['\"]:\s{0,4}['\"]?" + r"[0-9nai]"),
        None,
        _c(r"\{['\"]loss['\"]:\s{0,4}['\"]?" + _NUM),
        epoch_pattern=_c(r"['\"]epoch['\"]:\s{0,4}['\"]?([0-9]{1,9}(?:\.[0-9]{1,12})?)"),
    ),
    _Format(
        "lightning",
        _c(
            r"\bEpoch (?P<epoch>[0-9]{1,9})(?:/[0-9]{1,9})?:\s{1,32}[0-9]{1,3}%\|[^|]{0,200}\|"
            + _SP
            + r"(?P<step>[0-9]{1,15})/(?P<total>[0-9]{1,15}|\?)"
            + _SP
            + r"\["
        ),
        1,
        _c(r"\b(?:train[_/])?loss(?:_step)?[=:]" + _SP + _NUM),
        zero_is_start=True,
    ),
    # Lightning's RichProgressBar: Epoch 3/-2 ━━━━━━━━ 8/8 0:00:00 • 0:00:00 14.95it/s
    _Format(
        "lightning",
        _c(
            r"\bEpoch (?P<epoch>[0-9]{1,9})(?:/-?[0-9]{1,9})?\s{1,8}[━╸╺╾─\- ]{1,300}?\s{0,8}"
            r"(?P<step>[0-9]{1,15})/(?P<total>[0-9]{1,15})\b"
        ),
        1,
        _c(r"\b(?:train[_/])?loss(?:_step)?[=:]" + _SP + _NUM),
        zero_is_start=True,
    ),
    # PyTorch's MNIST example: Train Epoch: 1 [640/60000 (1%)]\tLoss: 0.107590 (1-based)
    _Format(
        "pytorch_examples",
        _c(r"\bTrain Epoch: (?P<epoch1>[0-9]{1,9}) \[(?P<seen>[0-9]{1,15})/(?P<of>[0-9]{1,15})"),
        None,
        _c(r"\bLoss: " + _NUM),
    ),
    # PyTorch's DDP tutorial: [GPU0] Epoch 3 | Batchsize: 32 | Steps: 64 (0-based, at its start)
    _Format("pytorch_examples", _c(r"\bEpoch (?P<epoch0>[0-9]{1,9}) \| "), None),
    # n/total [elapsed<left
    _tqdm(
        r"(?<![0-9])[0-9]{1,3}%\|[^|]{0,200}\|"
        + _SP
        + r"(?P<step>[0-9]{1,15})/(?P<bar_total>[0-9]{1,15}) \[[0-9:]{1,20}<"
    ),
    _tqdm(r"(?<![0-9])(?P<step>[0-9]{1,15})it \[[0-9:]{1,20},"),  # an unknown total: n it [elapsed,
    _Format(
        "plain",
        # "resuming from step 1000", "saved at step 500" name a step, they do not take one; a
        # digit may touch it (a bar printed with no newline: "| 41/1000000step 42 loss 2.0"),
        # a letter or "_" may not ("Substep 3", "global_step=10")
        _c(
            r"(?<![A-Za-z_])[Ss](?<!from .)(?<!at .)(?<!to .)(?<!of .)(?<!after .)(?<!before .)tep"
            + r"\s{0,32}[:=]?"
            + _SP
            + r"([0-9]{1,15})(?:"
            + _SP
            + "/"
            + _SP
            + r"[0-9]{1,15})?\b"
        ),
        1,
        _c(r"\bloss\s{0,32}[:=]?" + _SP + _NUM),
    ),
)

_KEYWORDS: Final = ("iter", "step", "Step", "Epoch", "it/s", "s/it", "it [", "'loss'", '"loss"')
_KEYWORDS_B: Final = tuple(k.encode() for k in _KEYWORDS)
_T = TypeVar("_T", str, bytes)


_TRAINING_DESC: Final = re.compile(r"train|epoch|step|iter", re.IGNORECASE)
_ERROR_LINE: Final = re.compile(
    r"[A-Za-z](?:Error|Exception)\b|\bTraceback\b|\b(?:error|ERROR|Error|failed|FAILED)\b[:!]?"
)
_NOT_TRAINING_DESC: Final = re.compile(r"eval|valid|test|sanity|predict", re.IGNORECASE)
# what precedes a step or a loss that is not training's: "[eval] step 10", "Validation step 3",
# "val loss 2.5", "test/loss: 3.1" (an evaluation's own step and loss, never the run's)
_EVAL_BEFORE: Final = re.compile(
    r"(?:\beval|\bval|valid|validation|\btest)\w{0,8}[\s_/:|\]-]{0,3}$", re.I
)
_EVAL_PREFIX: Final = re.compile(r"\beval|\bval\b|\bvalid|\btest(?:ing)?\b", re.IGNORECASE)


def _training_bar(desc: str) -> bool:
    """A bar without a description (Hugging Face's Trainer) or one that says it trains."""
    desc = desc.strip()
    if not desc:
        return True
    return _TRAINING_DESC.search(desc) is not None and _NOT_TRAINING_DESC.search(desc) is None


def match_line(line: str) -> StepLine | None:
    """The first format that recognises ``line`` (a single line, no terminator).

    Only the line's first ``MAX_MATCH_CHARS`` characters are matched: linear and bounded
    whatever the job prints.
    """
    line = line[:MAX_MATCH_CHARS]
    if "\x1b" in line:
        line = _ANSI_ESCAPE.sub("", line)
    error_line = _ERROR_LINE.search(line) is not None
    for fmt in FORMATS:
        if error_line and fmt.name == "plain":
            continue  # "RuntimeError: injected crash after step 30" names a step, takes none
        found = fmt.pattern.search(line)
        if found is None:
            continue
        if fmt.training_desc_only and not _training_bar(line[: found.start()]):
            continue  # "Map:", "Loading checkpoint shards:", "Sanity Checking…": not training
        if fmt.name == "plain" and _EVAL_PREFIX.search(line, 0, found.start()) is not None:
            return None  # "[eval] step 10 loss 3.2": an evaluation's own count, not a step
        step: int | None = None
        if fmt.step_group is not None:
            named = found.groupdict().get("step")
            digits = named or next((g for g in found.groups() if g is not None), None)
            step = bounded_int(digits) if digits is not None else None
            if step is None:
                return None  # a number beyond any count (bounds.py): not a step line
            if fmt.zero_is_start and step == 0:
                return None
        loss = _loss(fmt.loss_pattern, line)
        total = found.groupdict().get("bar_total")
        shape = StepLine(fmt.name, step, loss, total=bounded_int(total) if total else None)
        return _with_epoch(shape, found, fmt, line)
    return None


def _loss(pattern: re.Pattern[str] | None, line: str) -> float | None:
    """A loss: a finite number, or NaN/infinity as printed (a divergence is evidence too)."""
    if pattern is None:
        return None
    # the first loss that is training's: "val loss 2.5" or "eval/loss: nan" is evaluation's
    found = next(
        (m for m in pattern.finditer(line) if not _EVAL_BEFORE.search(line, 0, m.start())), None
    )
    if found is None:
        return None
    text = found.group(1)
    if text.lstrip("-") in ("nan", "inf"):
        return float(text)
    return finite_float(text)


def _number(pattern: re.Pattern[str] | None, line: str) -> float | None:
    found = pattern.search(line) if pattern is not None else None
    if found is None:
        return None
    return finite_float(found.group(1))


def _with_epoch(found: StepLine, match: re.Match[str], fmt: _Format, line: str) -> StepLine:
    """The epoch a line names: a bar's (epoch, batch/total), MNIST's ``[seen/total]``, a count."""
    groups = match.groupdict()
    if groups.get("epoch") is not None:
        total = groups.get("total")
        batches = bounded_int(total) if total is not None and total.isdigit() else None
        index = bounded_int(groups["epoch"])
        if index is None:
            return found
        done = index + (found.step or 0) / batches if batches else float(index)
        return replace(found, epoch=round(done, 4), epoch_index=index, batches=batches)
    if groups.get("epoch1") is not None:
        of, epoch1, seen = (bounded_int(groups[k]) for k in ("of", "epoch1", "seen"))
        if of is None or epoch1 is None or seen is None:
            return found
        done = epoch1 - 1 + (seen / of if of else 0.0)
        return replace(found, epoch=round(done, 4))
    if groups.get("epoch0") is not None:
        return replace(found, epoch=finite_float(groups["epoch0"]))
    epoch = _number(fmt.epoch_pattern, line)
    return replace(found, epoch=epoch) if epoch is not None else found


def _keyword_lines(text: _T, keywords: Sequence[_T], newline: _T) -> Iterator[str]:
    """Up to ``_LINES_TRIED`` lines that hold a keyword, last first (lazily).

    Each keyword's last position is found once and moved back only when passed, and a
    keyword absent from the text is dropped: a handful of C-speed scans per frame.
    """
    where = {k: p for k in keywords if (p := text.rfind(k)) >= 0}
    for _ in range(_LINES_TRIED):
        if not where:
            return
        hit = max(where.values())
        start = text.rfind(newline, 0, hit) + 1
        stop = text.find(newline, hit)
        line = text[start : len(text) if stop < 0 else stop]
        yield line.decode("utf-8", "replace") if isinstance(line, bytes) else line
        for key, pos in list(where.items()):
            if pos >= start:
                before = text.rfind(key, 0, start)
                if before < 0:
                    del where[key]
                else:
                    where[key] = before


def _tail(lines: Sequence[_T]) -> Sequence[_T]:
    """The last lines of a frame (the latest step is near its end)."""
    return lines[-_TAIL_LINES:]


def _tail_text(text: bytes) -> bytes:
    """The last ``_TAIL_LINES`` lines of newline-joined text, without splitting it."""
    start = len(text)
    for _ in range(_TAIL_LINES):
        start = text.rfind(b"\n", 0, start)
        if start < 0:
            return text
    return text[start + 1 :]


# Rich's bar in a narrow terminal or a pipe puts its metrics on the line after the bar, in
# the order they were logged (``v_num: 0.000 train_loss: 0.112``): the training loss anywhere
# in it, never ``val_loss`` (a word boundary that "_" does not make).
_WRAPPED_LOSS: Final = re.compile(
    r"(?:^|[\s,])(?:train[_/])?loss(?:_step|_epoch)?[=:]" + _SP + _NUM
)


def _wrapped_loss(text: str) -> float | None:
    """A loss on a line of its own after a Lightning bar (Rich wrapped it), the newest."""
    for line in reversed(text.split("\n")[-_TAIL_LINES:]):
        found = _WRAPPED_LOSS.search(line[:MAX_MATCH_CHARS])
        if found is not None:
            return finite_float(found.group(1))
    return None


class FormatMatcher:
    """Finds the last recognised step in a frame of lines."""

    def last_step(self, lines: Sequence[str]) -> StepLine | None:
        """The last step line among ``lines``, or None (only the frame's tail is joined)."""
        return self._search("\n".join(_tail(lines)), _KEYWORDS, "\n")

    def last_step_text(self, text: bytes) -> StepLine | None:
        """The same over the framer's JSON-safe ASCII lines, joined as they came (``Frame.text``)."""
        return self._search(_tail_text(text), _KEYWORDS_B, b"\n")

    @staticmethod
    def _search(text: _T, keywords: Sequence[_T], newline: _T) -> StepLine | None:
        """The last step line; a loss or epoch from a line just before it is kept with it
        (Hugging Face logs its loss on a line of its own, then redraws the bar)."""
        best: StepLine | None = None
        # Only a frame that mentions a loss (or an epoch) can add one from an older line: the
        # common frame stops at its step, and a step with its loss stops there too when no
        # line of the frame says "epoch" (every epoch format has the word).
        if isinstance(text, str):
            has_loss, has_epoch = "loss" in text, "poch" in text
        else:
            has_loss, has_epoch = b"loss" in text, b"poch" in text
        for line in _keyword_lines(text, keywords, newline):
            found = match_line(line)
            if found is None:
                continue
            if best is None:
                best = found
            else:
                best = replace(
                    best,
                    loss=best.loss if best.loss is not None else found.loss,
                    epoch=best.epoch if best.epoch is not None else found.epoch,
                )
            loss_done = best.loss is not None or not has_loss
            if loss_done and (best.epoch is not None or not has_epoch):
                break
        if best is not None and best.loss is None and has_loss and best.format == "lightning":
            wrapped = _wrapped_loss(
                text.decode("ascii", "replace") if isinstance(text, bytes) else text
            )
            best = replace(best, loss=wrapped) if wrapped is not None else best
        return best
