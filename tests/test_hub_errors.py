"""Hub refusals (gated, not found, no or bad token, offline) become one line naming the model spec and the fix.

The errors are huggingface_hub's own types, built as its tests build them (a message and an httpx2 response),
and raised by a mocked `snapshot_download`, so nothing here reaches the network.
"""

from __future__ import annotations

import unittest
from unittest import mock

import httpx2
from huggingface_hub.errors import (DisabledRepoError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                    RepositoryNotFoundError, RevisionNotFoundError)

from wordle_mlx.errors import UserError
from wordle_mlx.llm.model import hub, models

REPO = "someone/gemma-3-4b-it-bf16"


def response(status: int) -> httpx2.Response:
    return httpx2.Response(status, request=httpx2.Request("GET", f"https://huggingface.co/api/models/{REPO}"),
                           headers={"x-request-id": "Root=1-abc"})


def refusal_from(exc: Exception, spec: str = REPO) -> str:
    """The UserError message loading `spec` gives when snapshot_download raises `exc`."""
    with mock.patch.object(hub, "snapshot_download", side_effect=exc):
        try:
            models.load_model(spec)
        except UserError as err:
            return str(err)
    raise AssertionError(f"{exc!r} did not become a UserError")


class HubErrorTest(unittest.TestCase):
    def assert_one_line(self, message: str, *parts: str) -> None:
        self.assertNotIn("\n", message)
        self.assertIn(f"model {REPO!r}", message)
        self.assertNotIn("Request ID", message)
        for part in parts:
            self.assertIn(part, message)

    def test_gated(self):
        message = refusal_from(GatedRepoError("403 Client Error. Cannot access gated repo", response=response(403)))
        self.assert_one_line(message, "gated", f"https://huggingface.co/{REPO}", "hf auth login", "HF_TOKEN")

    def test_not_found_or_private(self):
        for status in (401, 404):     # the Hub answers 401 for a missing repo when no token is sent
            with self.subTest(status=status):
                message = refusal_from(RepositoryNotFoundError(f"{status} Client Error. (Request ID: Root=1-abc)",
                                                               response=response(status)))
                self.assert_one_line(message, "not found", "check the repo id", "hf auth login", "HF_TOKEN")

    def test_unauthorised_and_forbidden(self):
        message = refusal_from(HfHubHTTPError("401 Client Error. (Request ID: Root=1-abc)", response=response(401)))
        self.assert_one_line(message, "401", "hf auth login", "HF_TOKEN")
        message = refusal_from(HfHubHTTPError("403 Client Error. (Request ID: Root=1-abc)", response=response(403)))
        self.assert_one_line(message, "403", "hf auth login", "HF_TOKEN")

    def test_revision_disabled_offline_and_server_errors(self):
        self.assert_one_line(refusal_from(RevisionNotFoundError("404 Client Error.", response=response(404))),
                             "revision not found")
        self.assert_one_line(refusal_from(DisabledRepoError("403 Client Error.", response=response(403))),
                             "disabled")
        self.assert_one_line(refusal_from(LocalEntryNotFoundError("Cannot find an appropriate cached snapshot "
                                                                  "folder\nPlease check your internet connection")),
                             "not in the Hugging Face cache", "HF_HUB_OFFLINE")
        self.assert_one_line(refusal_from(HfHubHTTPError("503 Server Error: unavailable\nmore", response=response(503))),
                             "503 Server Error", "try again later")

    def test_the_tokenizer_only_download_says_the_same(self):
        """The data stage's tokenizer download (no weights) goes through the same conversion."""
        with mock.patch.object(hub, "snapshot_download",
                               side_effect=GatedRepoError("403", response=response(403))) as download:
            with self.assertRaises(UserError) as ctx:
                models.download_model(REPO, REPO, weights=False)
        self.assert_one_line(str(ctx.exception), "gated", "hf auth login")
        patterns = download.call_args.kwargs["allow_patterns"]
        self.assertIn("*.json", patterns)
        self.assertFalse(any(p.endswith(".safetensors") for p in patterns))

    def test_a_download_that_works_returns_the_snapshot(self):
        with mock.patch.object(hub, "snapshot_download", return_value="/cache/snapshots/abc") as download:
            self.assertEqual(str(models.download_model(REPO, REPO)), "/cache/snapshots/abc")
        self.assertIn("model*.safetensors", download.call_args.kwargs["allow_patterns"])


if __name__ == "__main__":
    unittest.main()
