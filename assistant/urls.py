from django.urls import path

from assistant import views

app_name = "assistant"

urlpatterns = [
    path("", views.chat_page, name="chat"),
    path("api/chat/beacon", views.beacon, name="beacon"),
    path("api/conversations", views.conversations, name="conversations"),
    path(
        "api/conversations/<uuid:conversation_id>", views.conversation_detail, name="conversation"
    ),
]
