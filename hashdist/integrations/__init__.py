"""Integrations with training frameworks, each imported on its own (``hashdist.integrations.torchmetrics``): they
import their framework, which ``import hashdist`` never does."""
