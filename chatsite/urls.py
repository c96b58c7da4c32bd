from django.contrib import admin
from django.urls import include, path

from assistant.views import admin_login, metrics_export

urlpatterns = [
    path("", include("assistant.urls")),
    # Before the admin's own: the same page, throttled (assistant/forms.py).
    path("admin/login/", admin_login),
    path("admin/", admin.site.urls),
    # The language switcher posts here (Django's set_language: CSRF, a cookie, back to "next").
    path("i18n/", include("django.conf.urls.i18n")),
    path("teach/", include("assistant.teach_urls")),
    # django_prometheus's exposition, this worker's waiting observations made first.
    path("metrics", metrics_export, name="prometheus-django-metrics"),
]

# A request Django cannot read answers the JSON error to a script, not an HTML page.
handler400 = "assistant.busy.bad_request"
# A database that cannot take a request now answers 503 with Retry-After, not a 500 page.
handler500 = "assistant.busy.server_error"
