"""The teachers' pages, under ``/teach/``: accounts and classes (``teach_views.py``), the live
figures of a teacher's classes (``teach_dashboard_views.py``), and a class's API keys
(``teach_keys_views.py``)."""

from django.urls import path

from assistant import teach_dashboard_views, teach_keys_views, teach_views

app_name = "teach"

urlpatterns = [
    path("", teach_views.class_list, name="classes"),
    path("login/", teach_views.teach_login, name="login"),
    path("logout/", teach_views.teach_logout, name="logout"),
    path("password/", teach_views.password_change, name="password"),
    path("password/done/", teach_views.password_done, name="password-done"),
    path("new", teach_views.class_new, name="new"),
    path("dashboard/", teach_dashboard_views.teach_dashboard, name="dashboard"),
    path("api/figures", teach_dashboard_views.teach_figures, name="figures"),
    path("<uuid:classroom_id>/", teach_views.class_page, name="class"),
    path("<uuid:classroom_id>/code", teach_views.class_code_rotate, name="code"),
    path("<uuid:classroom_id>/pause", teach_views.class_pause_set, name="pause"),
    path(
        "<uuid:classroom_id>/questions",
        teach_dashboard_views.class_questions_page,
        name="questions",
    ),
    path(
        "<uuid:classroom_id>/records.csv",
        teach_dashboard_views.class_records_csv,
        name="records",
    ),
    path("<uuid:classroom_id>/keys", teach_keys_views.class_keys_page, name="keys"),
    path(
        "<uuid:classroom_id>/keys/<uuid:key_id>/revoke",
        teach_keys_views.class_key_revoke,
        name="key-revoke",
    ),
]
