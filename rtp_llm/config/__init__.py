from rtp_llm.config.model_config import ARCHITECTURES, ModelConfig, RopeConfig

__all__ = ["ARCHITECTURES", "ModelConfig", "RopeConfig"]
