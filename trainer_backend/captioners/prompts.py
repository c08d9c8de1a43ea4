"""What a captioner is asked and what is written (pure: the CLI, the job and the tests call these).

Targets: "natural" (sentences, what the flow-matching families' text encoders read best) or "tags"
(comma-separated booru tags, what SD1.5/SDXL anime models were trained on); lengths: "short" or
"detailed". The generated text is then finished the same way for every captioner: whitespace made
one line, words to avoid removed (a tag that contains one is dropped), cut to a maximum number of
words (tags stay whole), and the trigger word put first. The policy for an existing caption
decides what is written: skip (keep it), overwrite, or append the new text after it.
"""
from __future__ import annotations

import re

TARGETS = ("natural", "tags")
LENGTHS = ("short", "detailed")
POLICIES = ("skip", "overwrite", "append")

# Florence-2 is steered by task tokens, not free text: its processor expands them into its prompts
FLORENCE_TASKS = {"short": "<CAPTION>", "detailed": "<MORE_DETAILED_CAPTION>"}
# JoyCaption was trained on these phrasings (its model card's prompt list)
JOYCAPTION_PROMPTS = {
    ("natural", "short"): "Write a short descriptive caption for this image in a formal tone.",
    ("natural", "detailed"): "Write a long descriptive caption for this image in a formal tone.",
    ("tags", "short"): "Write a list of Booru-like tags for this image.",
    ("tags", "detailed"): "Write a list of Booru-like tags for this image.",
}
CHAT_PROMPTS = {
    ("natural", "short"): "Describe this image in one sentence, as a caption for training an image model.",
    ("natural", "detailed"): ("Describe this image in detail as one paragraph of plain prose: the subject and its "
                              "appearance, the setting, the lighting, the style and the composition. "
                              "No lists, no headings, no introduction."),
    ("tags", "short"): ("List 10 to 20 booru-style tags for this image, comma-separated, most important first. "
                        "Output only the tags."),
    ("tags", "detailed"): ("List 30 to 50 booru-style tags for this image, comma-separated, most important first. "
                           "Output only the tags."),
}
# new tokens to generate by default: a short caption fits in 77 CLIP tokens, a detailed one in ~300
DEFAULT_NEW_TOKENS = {"short": 96, "detailed": 384}


def instruction(kind: str, target: str, length: str, avoid: tuple[str, ...] = (), custom: str = "") -> str:
    """The text a vision-language captioner is given ('' for the tagger, which takes none)."""
    if kind == "wd14":
        return ""
    if kind == "florence2":
        return FLORENCE_TASKS[length]   # its task tokens admit no other words; `avoid` acts afterwards
    text = custom.strip() or (JOYCAPTION_PROMPTS if kind == "joycaption" else CHAT_PROMPTS)[(target, length)]
    if avoid:
        text += " Do not use these words: " + ", ".join(avoid) + "."
    return text


def split_words(text: str) -> list[str]:
    return [w.strip() for w in text.replace("\n", ",").split(",") if w.strip()]


def _word_pattern(words: tuple[str, ...]) -> re.Pattern | None:
    words = tuple(w.strip() for w in words if w.strip())
    if not words:
        return None
    return re.compile(r"(?<!\w)(" + "|".join(re.escape(w) for w in words) + r")(?!\w)", re.IGNORECASE)


def _tags(text: str) -> list[str]:
    seen, out = set(), []
    for tag in (t.strip() for t in text.split(",")):
        if tag and tag.lower() not in seen:
            seen.add(tag.lower())
            out.append(tag)
    return out


def _cut_words(text: str, max_words: int) -> str:
    words = text.split()
    if max_words <= 0 or len(words) <= max_words:
        return text
    cut = " ".join(words[:max_words])
    end = max(cut.rfind(". "), cut.rfind("! "), cut.rfind("? "))
    if end >= len(cut) // 2:   # end at the last full sentence when one ends in the second half
        return cut[:end + 1]
    return cut.rstrip(",;: ")


def finish(raw: str, target: str, avoid: tuple[str, ...] = (), max_words: int = 0) -> str:
    """The generated text as one caption line: words to avoid removed, cut to max_words (0: no limit)."""
    pattern = _word_pattern(avoid)
    text = " ".join(raw.split())
    if target == "tags":
        tags = [t for t in _tags(text) if pattern is None or not pattern.search(t)]
        kept, count = [], 0
        for tag in tags:
            n = len(tag.split())
            if max_words > 0 and count + n > max_words:
                break
            kept.append(tag)
            count += n
        return ", ".join(kept)
    if pattern is not None:
        text = pattern.sub("", text)
        text = re.sub(r"\s+([,.;:!?])", r"\1", " ".join(text.split()))
        text = re.sub(r"([,;:])(?:\s*[,;:])+", r"\1", text).strip(" ,;:")
    return _cut_words(text, max_words)


def with_trigger(caption: str, trigger: str) -> str:
    """The trigger word first (once): "ohwx, a dog on a beach"."""
    trigger = trigger.strip()
    if not trigger:
        return caption
    if caption.lower() == trigger.lower() or caption.lower().startswith(trigger.lower() + ","):
        return caption
    return f"{trigger}, {caption}" if caption else trigger


def merged(existing: str | None, new: str, policy: str, target: str, trigger: str = "") -> str | None:
    """The caption to write, or None to leave the file as it is. `existing` is the caption file's
    text (None: no file; blank counts as none)."""
    if policy not in POLICIES:
        raise ValueError(f"--existing: {policy!r} is not one of {', '.join(POLICIES)}")
    old = (existing or "").strip()
    if not old:
        return with_trigger(new, trigger)
    if policy == "skip":
        return None
    if policy == "overwrite":
        return with_trigger(new, trigger)
    if not new:
        return None
    glue = ", " if target == "tags" or old.endswith(",") else (" " if old[-1] in ".!?" else ". ")
    return with_trigger(old.rstrip(",") + glue + new, trigger)
