"""The app's dialogs, one module each."""

from localchat.tui.widgets.dialogs.confirm import Confirm
from localchat.tui.widgets.dialogs.help import HelpScreen
from localchat.tui.widgets.dialogs.model_picker import ModelChoice, ModelPicker
from localchat.tui.widgets.dialogs.system_prompt import SystemPromptEditor
from localchat.tui.widgets.dialogs.text_prompt import TextPrompt

__all__ = ["Confirm", "HelpScreen", "ModelChoice", "ModelPicker", "SystemPromptEditor", "TextPrompt"]
