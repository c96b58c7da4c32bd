from django.urls import path

from assistant import class_views, dashboard_views, stream_views, views

app_name = "assistant"

urlpatterns = [
    path("", views.chat_page, name="chat"),
    path("api/session", views.session_renew, name="session"),
    path("c/", class_views.class_join_page, name="join"),
    path("c/leave", class_views.class_leave_view, name="leave"),
    path("c/<str:code>", class_views.class_join_page, name="join-code"),
    path("api/chat/beacon", views.beacon, name="beacon"),
    # Reached through the ASGI router (chatsite/asgi.py) when it picks the "django" path.
    path("api/chat/stream", stream_views.chat_stream, name="stream"),
    path("api/chat/stream/django", stream_views.chat_stream, name="stream-django"),
    path("api/chat/resume", stream_views.chat_resume, name="resume"),
    path("api/chat/stop", stream_views.chat_stop, name="stop"),
    path("dashboard/", dashboard_views.dashboard, name="dashboard"),
    path("dashboard/events", dashboard_views.dashboard_events, name="dashboard-events"),
    path(
        "dashboard/api/snapshot", dashboard_views.dashboard_snapshot_json, name="dashboard-snapshot"
    ),
    path("dashboard/api/split", dashboard_views.split_update, name="dashboard-split"),
    path("api/conversations", views.conversations, name="conversations"),
    path(
        "api/conversations/<uuid:conversation_id>", views.conversation_detail, name="conversation"
    ),
]
