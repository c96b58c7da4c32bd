from django.apps import AppConfig


class AssistantConfig(AppConfig):
    name = "assistant"
    verbose_name = "Assistant"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from assistant.services.class_versions import class_versions_connect

        class_versions_connect()
