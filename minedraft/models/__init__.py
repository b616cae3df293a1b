"""Our decoder implementation and checkpoint loading."""

from minedraft.models.hf_format import SUPPORTED_ARCHITECTURES, ModelArgs
from minedraft.models.llama import Decoder
from minedraft.models.loader import load_model, resolve_model

__all__ = ["SUPPORTED_ARCHITECTURES", "Decoder", "ModelArgs", "load_model", "resolve_model"]
