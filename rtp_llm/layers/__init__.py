"""The model's building blocks: linear layers holding their device-chosen kernels, RMSNorm, the gated MLP and the
rotary tables. Their math runs on the device's op set (rtp_llm/device/)."""
