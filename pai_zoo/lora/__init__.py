"""LoRA: adapters on megatron-core's parallel linears, exchanged with Hugging Face PEFT (docs/lora.md).

``settings`` (no torch) holds the hyper-parameters and PEFT's config; ``targets`` finds the adaptable linears in a
family's weight-mapping table; ``peft_format`` reads and writes PEFT folders; ``run`` a LoRA run's folder; ``export``
its way out to PEFT or a merged HF folder. The adapters on the model itself are :mod:`pai_zoo.lora.adapters`.
"""
