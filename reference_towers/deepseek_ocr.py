"""DeepSeek-OCR's processor sizes, for the standalone target.

vLLM 0.33.0 fixes them as module constants of
``vllm/transformers_utils/processors/deepseek_ocr.py`` (the "Gundam" mode):
every image's global view is padded to ``BASE_SIZE`` pixels square, and a
tiled image is cut into ``IMAGE_SIZE``-pixel tiles. The generated mixin reads
them as vLLM's own mixin does; there is no reference tower here yet.
"""

BASE_SIZE = 1024
IMAGE_SIZE = 640
