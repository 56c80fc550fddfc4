from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard.views.common import csp
from dashboard.views import artifacts, compression, conversation, conversations, llm_call, overview, tools

urlpatterns = [
    path("login/", csp(auth_views.LoginView.as_view(redirect_authenticated_user=True)), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", overview.overview, name="overview"),
    path("conversations/", conversations.conversation_list, name="conversations"),
    path("conversations/<int:pk>/", conversation.conversation_detail, name="conversation"),
    path("llm-calls/<int:pk>/", llm_call.llm_call_detail, name="llm-call"),
    path("compressions/", compression.compression_list, name="compressions"),
    path("compressions/<int:pk>/", compression.compression_detail, name="compression"),
    path("tools/", tools.tools, name="tools"),
    path("tools/calls/", tools.tool_calls, name="tool-calls"),
    path("artifacts/", artifacts.artifact_list, name="artifacts"),
    path("artifacts/<str:artifact_id>/", artifacts.artifact_detail, name="artifact"),
    # JSON fragments the pages' scripts fetch when their websocket says something changed.
    path("fragments/overview/", overview.overview_fragments, name="overview-fragments"),
    path("fragments/conversations/", conversations.conversation_list_fragments, name="conversations-fragments"),
    path("fragments/conversations/<int:pk>/", conversation.conversation_fragments, name="conversation-fragments"),
    path("fragments/tools/", tools.tools_fragments, name="tools-fragments"),
    path("fragments/artifacts/", artifacts.artifact_list_fragments, name="artifacts-fragments"),
]
