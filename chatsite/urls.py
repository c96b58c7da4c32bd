from django.contrib import admin
from django.urls import include, path

from assistant.views import admin_login

urlpatterns = [
    path("", include("assistant.urls")),
    # Before the admin's own: the same page, throttled (assistant/forms.py).
    path("admin/login/", admin_login),
    path("admin/", admin.site.urls),
    path("", include("django_prometheus.urls")),
]
