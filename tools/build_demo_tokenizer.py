"""Build dataprep/assets/demo_tokenizer.json: a small byte-level BPE for the demo set.

Run once by a developer (``python tools/build_demo_tokenizer.py``); the result is committed so
the demo needs no download and stays byte-identical.
"""

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dataprep.demo import demo_text_corpus

SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<image>",
    "<img>",
    "</img>",
    "<s>",
    "</s>",
]


def main() -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = demo_text_corpus(seed=12345, n=3000)
    corpus += ["system user assistant USER: ASSISTANT: A chat between a curious human"] * 20
    tok.train_from_iterator(corpus, trainer=trainer)
    out = Path(__file__).resolve().parents[1] / "dataprep" / "assets" / "demo_tokenizer.json"
    tok.save(str(out))
    print(f"wrote {out} ({out.stat().st_size} bytes, vocab {tok.get_vocab_size()})")


if __name__ == "__main__":
    main()
