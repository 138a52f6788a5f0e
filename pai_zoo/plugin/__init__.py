"""L0, the plugin API: what a plugin speaks. Errors, the hook specifications, config translation (ConfigMap and
its rules), Megatron-LM's argument names, the quantization and vision declarations a family carries."""
