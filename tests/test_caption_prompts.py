"""What a caption job writes, from the generated text: words to avoid gone, the trigger first, the
length cut, the policy for an existing caption; and the job's options survive the argv the studio
starts it with (pure functions, property tests)."""
import argparse
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from trainer_backend.captioners.options import CaptionOptions, add_arguments, from_namespace, to_argv
from trainer_backend.captioners.prompts import POLICIES, finish, instruction, merged, with_trigger
from trainer_backend.captioners.tagger import tag_name

words = st.text(alphabet="abcdefgh", min_size=1, max_size=6)
sentences = st.lists(words, min_size=0, max_size=30).map(" ".join)
tag_lists = st.lists(st.lists(words, min_size=1, max_size=3).map(" ".join), max_size=20).map(", ".join)


@given(raw=sentences | tag_lists, target=st.sampled_from(["natural", "tags"]),
       avoid=st.lists(words, max_size=3), max_words=st.integers(0, 12))
def test_avoided_words_never_reach_the_caption_and_it_fits_the_length(raw, target, avoid, max_words):
    caption = finish(raw, target, tuple(avoid), max_words)
    for word in avoid:
        assert not re.search(rf"(?<!\w){re.escape(word)}(?!\w)", caption, re.IGNORECASE), (word, caption)
    if max_words:
        assert len(caption.split()) <= max_words
    assert caption == caption.strip() and "\n" not in caption


@given(raw=tag_lists, max_words=st.integers(1, 10))
def test_tags_stay_whole_when_cut(raw, max_words):
    kept = finish(raw, "tags", (), max_words).split(", ")
    original = [t.strip() for t in raw.split(",")]
    assert all(t in original for t in kept if t)


@given(caption=sentences, trigger=words)
def test_the_trigger_comes_first_once(caption, trigger):
    out = with_trigger(caption, trigger)
    assert out.startswith(trigger)
    assert with_trigger(out, trigger) == out


@given(existing=st.none() | st.just("") | sentences, new=sentences, policy=st.sampled_from(POLICIES),
       target=st.sampled_from(["natural", "tags"]))
def test_an_existing_caption_is_kept_unless_the_policy_says_otherwise(existing, new, policy, target):
    out = merged(existing, new, policy, target)
    if not (existing or "").strip():
        assert out == new          # no caption yet: every policy writes the new one
    elif policy == "skip":
        assert out is None         # left as it is
    elif policy == "overwrite":
        assert out == new
    elif new:
        assert out.startswith(existing.strip().rstrip(",")) and out.endswith(new)


def test_append_puts_the_trigger_first_only_when_the_old_caption_lacks_it():
    assert merged("ohwx, a dog", "on grass", "append", "tags", "ohwx") == "ohwx, a dog, on grass"
    assert merged("A dog.", "It runs.", "append", "natural", "ohwx") == "ohwx, A dog. It runs."


def test_prompts_per_target_and_captioner():
    assert instruction("florence2", "natural", "detailed") == "<MORE_DETAILED_CAPTION>"
    assert instruction("wd14", "tags", "short") == ""
    tags = instruction("qwen2_5_vl", "tags", "short", ("watermark",))
    assert "tags" in tags and "watermark" in tags
    assert "Booru" in instruction("joycaption", "tags", "detailed")
    assert instruction("qwen3_vl", "natural", "short", (), "Say what the dog does.") == "Say what the dog does."


def test_tag_names_read_as_words_and_kaomoji_stay():
    assert tag_name("long_hair") == "long hair"
    assert tag_name("^_^") == "^_^" and tag_name("o_o") == "o_o"


@settings(max_examples=30)
@given(options=st.builds(
    CaptionOptions, dataset=words, model=words, target=st.sampled_from(["auto", "natural", "tags"]),
    trigger=st.text(max_size=8), avoid=st.lists(words, max_size=3).map(tuple), max_words=st.integers(0, 99),
    existing=st.sampled_from(POLICIES), batch_size=st.integers(1, 64), preview=st.integers(0, 8),
    fresh=st.booleans(), prompt=st.text(alphabet="ab -=,", max_size=8).filter(lambda t: t != "--")))
    # (a value that is exactly "--" is argparse's own end-of-options marker, dropped by argparse itself)
def test_options_survive_the_argv_the_studio_starts_the_job_with(options):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert from_namespace(parser.parse_args(to_argv(options))) == options


def test_the_default_job_folder_is_named_after_the_dataset_as_the_queue_accepts():
    assert CaptionOptions(dataset="/data/my dogs (2)", model="m").resolved_job_dir().name == "caption-my-dogs-2"
    assert CaptionOptions(dataset="/data/hunde_größe", model="m").resolved_job_dir().name == "caption-hunde_größe"
