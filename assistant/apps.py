from django.apps import AppConfig


class AssistantConfig(AppConfig):
    name = "assistant"
    verbose_name = "Assistant"
    default_auto_field = "django.db.models.BigAutoField"
