"""The demo corpus: English speech synthesized with espeak-ng in LibriSpeech's layout.

Not part of the data pipeline: it only makes a corpus that the pipeline then reads like
any other (`asr-make-demo-corpus`, `recipes/demo/run.sh` stage 0).
"""
