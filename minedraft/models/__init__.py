"""Our decoder implementation and checkpoint loading."""

from minedraft.models.llama import SUPPORTED_ARCHITECTURES, Decoder, ModelArgs
from minedraft.models.loader import load_model, resolve_model

__all__ = ["SUPPORTED_ARCHITECTURES", "Decoder", "ModelArgs", "load_model", "resolve_model"]
