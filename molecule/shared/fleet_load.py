"""A bounded, steady stream of chat requests through the fleet's router, counting every failure: what a client
sees while a test updates or breaks the fleet behind it. Addresses are the scenario's own containers only."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field


@dataclass
class Load:
    base_url: str
    api_key: str
    model: str
    workers: int = 2
    max_requests: int = 5000  # a bound, whatever happens to the test
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    failed_started: list[float] = field(default_factory=list)  # time.monotonic() at which each failed one began
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def _one(self, number: int) -> None:
        began = time.monotonic()
        stream = number % 2 == 1  # every other request streams, so a cut mid-answer would show too
        body = {"model": self.model, "messages": [{"role": "user", "content": f"Count to {number}."}], "max_tokens": 4}
        if stream:
            body["stream"] = True
        request = urllib.request.Request(
            self.base_url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json", "authorization": f"Bearer {self.api_key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                text = response.read().decode()
            complete = "data: [DONE]" in text if stream else json.loads(text)["choices"][0]["message"] is not None
            problem = "" if complete else f"incomplete answer: {text[-200:]}"
        except (OSError, http.client.HTTPException, ValueError, LookupError) as error:  # a cut stream included
            detail = error.read().decode()[:200] if isinstance(error, urllib.error.HTTPError) else ""
            problem = f"{type(error).__name__}: {error} {detail}"
        with self._lock:
            if problem:
                self.failures.append(f"{time.strftime('%H:%M:%S')} request {number}: {problem}")
                self.failed_started.append(began)
            else:
                self.ok += 1

    def _run(self, offset: int) -> None:
        number = offset
        while not self._stop.is_set() and number < self.max_requests:
            self._one(number)
            number += self.workers
            time.sleep(0.05)

    def __enter__(self) -> Load:
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.workers)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=90)
