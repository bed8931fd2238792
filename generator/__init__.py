"""gen-mixin: vLLM encoder CUDA graph mixins generated from YAML specs.

The generator never imports torch: it reads a spec, validates it into a frozen
IR (``generator.resolve``), renders it with Jinja (``generator.render``),
formats it with black and writes it atomically (``generator.emit``).
"""

__version__ = "0.1.0"
