"""L7, conversion: ``pai-zoo convert`` (:mod:`.convert`), Hugging Face -> Megatron-Core (:mod:`.to_mcore`) and back
(:mod:`.to_hf`), ``--verify`` (:mod:`.verify`), and a LoRA run out to PEFT or merged (:mod:`.lora_export`).
Every file is read and written through :mod:`pai_zoo.formats`."""
