from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("", include("assistant.urls")),
    path("admin/", admin.site.urls),
    path("", include("django_prometheus.urls")),
]
