"""asr-serve's page as a person uses it: Debian's headless Chromium, driven by selenium,
opens it; a demo test utterance is streamed once as a chosen file and once as the
microphone (Chromium's fake capture device playing a WAV of it). The page must show the
utterance's streaming transcript, with its words' confidences, and send the phrases typed
in its box for the search to boost."""

from __future__ import annotations

import os
import time
from pathlib import Path

import jiwer
import numpy as np
import pytest
import soundfile as sf

from asr.inference.audio import read_audio
from asr.inference.server import ServeConfig
from asr.inference.streaming import StreamingRecognizer, load_streaming_recognizer
from tests.inference.test_serve import NO_ENDPOINTS, serving

CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.skipif(  # CI installs them (.ci/run): there a missing browser fails
        not (CHROMIUM.exists() and DRIVER.exists()) and not os.environ.get("CI"),
        reason="Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)",
    ),
]


@pytest.fixture(scope="module")
def recognizer(streaming_run: Path) -> StreamingRecognizer:
    return load_streaming_recognizer(streaming_run, 160)


@pytest.fixture(scope="module")
def utterance(test_flacs: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo test utterance as a 16 kHz WAV, with 0.5 s of silence before and 2 s after."""
    samples = read_audio(test_flacs[0])
    padded = np.concatenate([np.zeros(8000), samples, np.zeros(32000)]).astype(np.float32)
    path = tmp_path_factory.mktemp("page") / "utterance.wav"
    sf.write(path, padded, 16000, subtype="PCM_16")
    return path


def browser(microphone: Path | None = None):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--window-size=1000,700"):
        options.add_argument(argument)
    if microphone is not None:
        options.add_argument("--use-fake-ui-for-media-stream")
        options.add_argument("--use-fake-device-for-media-stream")
        options.add_argument(f"--use-file-for-fake-audio-capture={microphone}%noloop")
    return webdriver.Chrome(service=Service(str(DRIVER)), options=options)


def wait_for(driver, condition: str, timeout: float = 60.0) -> dict:
    """Poll `window.asrPage` until the JS `condition` on it (`page`) holds -> the page."""
    deadline = time.monotonic() + timeout
    while True:
        if driver.execute_script(f"const page = window.asrPage; return {condition};"):
            return driver.execute_script("return window.asrPage")  # read after it holds
        page = driver.execute_script("return window.asrPage")
        assert time.monotonic() < deadline, (
            condition,
            page,
            driver.find_element("id", "status").text,
        )
        time.sleep(0.2)


def shown_segments(driver) -> str:
    """The final segments' text as the page shows it."""
    return " ".join(e.text for e in driver.find_elements("css selector", "#finals .text"))


PHRASES = ["PORCUPINE", "QUEEN MURDROR :6"]


def boosted(recognizer: StreamingRecognizer, path: Path, phrases: list[str]):
    """The final transcript of `path` streamed with `phrases` boosted."""
    stream = recognizer.create_stream(biasing=phrases)
    samples = read_audio(path)
    for start in range(0, len(samples), 1600):
        stream.accept_waveform(samples[start : start + 1600])
        recognizer.decode([stream])
    stream.finish()
    recognizer.decode([stream])
    return stream.transcript()


def test_a_chosen_file_is_streamed_at_real_time_and_shown(recognizer, utterance, tmp_path):
    expected = boosted(recognizer, utterance, PHRASES)
    with serving(recognizer, ServeConfig(endpoints=NO_ENDPOINTS)) as base:
        driver = browser()
        try:
            driver.get(base)
            wait_for(driver, "!document.getElementById('file').disabled", 30)
            driver.find_element("id", "phrases").send_keys("\n".join(PHRASES))
            began = time.monotonic()
            driver.find_element("id", "file").send_keys(str(utterance))
            page = wait_for(driver, "page.state === 'done'", 60)
            took = time.monotonic() - began
            assert page["biasing"] == PHRASES
            assert " ".join(f["text"] for f in page["finals"]).strip() == expected.text
            assert shown_segments(driver) == expected.text
            # each word shown with its confidence, the doubtful ones marked
            words = driver.find_elements("css selector", "#finals .word")
            shown = [(w.text, float(w.get_attribute("data-confidence"))) for w in words]
            assert shown == [(w.word, w.confidence) for w in expected.words]
            doubtful = {w.text for w in words if "doubtful" in w.get_attribute("class")}
            assert doubtful == {w.word for w in expected.words if w.confidence < 0.8}
            assert page["latencyMs"] is not None and 0 <= page["latencyMs"] < 5000
            assert "done" in driver.find_element("id", "status").text
            driver.save_screenshot(str(tmp_path / "file.png"))
        finally:
            driver.quit()
    duration = sf.info(utterance).duration
    assert took >= duration - 0.5  # at real time, not as fast as it could


def test_the_example_button_streams_the_servers_example_at_real_time(recognizer, test_flacs):
    """A newcomer sees the model work before speaking to it: the server's example (a demo
    test utterance) streamed from the page, with the note on what the model can hear."""
    example = test_flacs[1]
    expected = recognizer.transcribe([read_audio(example)])[0].text
    with serving(recognizer, ServeConfig(endpoints=NO_ENDPOINTS), example) as base:
        driver = browser()
        try:
            driver.get(base)
            wait_for(driver, "!document.getElementById('example').disabled", 30)
            assert driver.find_element("id", "hears").is_displayed()
            assert "one speech synthesizer" in driver.find_element("id", "hears").text
            began = time.monotonic()
            driver.find_element("id", "example").click()
            page = wait_for(driver, "page.state === 'done'", 60)
            took = time.monotonic() - began
            assert " ".join(f["text"] for f in page["finals"]).strip() == expected
            assert (
                expected
                and f"example {example.name}: done" in driver.find_element("id", "status").text
            )
        finally:
            driver.quit()
    assert took >= sf.info(example).duration - 0.5  # at real time


def test_a_page_without_an_example_shows_no_button(recognizer):
    with serving(recognizer, ServeConfig()) as base:
        driver = browser()
        try:
            driver.get(base)
            wait_for(driver, "!document.getElementById('mic').disabled", 30)
            assert not driver.find_element("id", "example").is_displayed()
            assert not driver.find_element("id", "hears").is_displayed()
        finally:
            driver.quit()


def test_a_phrase_the_model_cannot_spell_is_named_on_the_page(recognizer, utterance):
    with serving(recognizer, ServeConfig(endpoints=NO_ENDPOINTS)) as base:
        driver = browser()
        try:
            driver.get(base)
            wait_for(driver, "!document.getElementById('file').disabled", 30)
            driver.find_element("id", "phrases").send_keys("CAFÉ")
            driver.find_element("id", "file").send_keys(str(utterance))
            wait_for(driver, "page.state === 'error'", 30)
            status = driver.find_element("id", "status").text
            # the controls come back for another try
            wait_for(driver, "!document.getElementById('file').disabled", 10)
        finally:
            driver.quit()
    assert "biasing phrase 'CAFÉ' cannot be tokenized" in status


def test_the_microphone_is_heard_and_transcribed(recognizer, utterance, tmp_path):
    """The fake microphone resamples the WAV (16 kHz to the device's 48 kHz, and the page
    back to 16 kHz), so the samples the server gets are close to the file's, not equal:
    the transcript must be close to the file's."""
    expected = recognizer.transcribe([utterance])[0].text
    duration = sf.info(utterance).duration
    with serving(recognizer, ServeConfig(endpoints=NO_ENDPOINTS)) as base:
        driver = browser(microphone=utterance)
        try:
            driver.get(base)
            wait_for(driver, "!document.getElementById('mic').disabled", 30)
            driver.find_element("id", "mic").click()
            wait_for(
                driver,
                f"Number(document.getElementById('decoded').textContent) >= {duration - 0.7}",
                60,
            )
            driver.find_element("id", "mic").click()  # stop: the page sends end
            page = wait_for(driver, "page.state === 'done'", 30)
            shown = shown_segments(driver)
            driver.save_screenshot(str(tmp_path / "microphone.png"))
        finally:
            driver.quit()
    heard = " ".join(f["text"] for f in page["finals"]).strip()
    assert heard and shown == heard
    # the page resampled the device's rate to 16 kHz: as many samples as the audio decoded
    assert abs(page["sentSamples"] / 16000 - duration) < 0.7, page["sentSamples"]
    assert jiwer.cer(expected, heard) < 0.3, (expected, heard)
