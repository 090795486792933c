"""``[mqtt]``, ``[[webhook]]`` and ``--mqtt``: validated once, one-line errors, exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ruseon_appliance.config import ConfigError, load_config, to_toml
from tests.pki import CertificateAuthority


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "ruseon.toml"
    path.write_text(text)
    return load_config(path, env={})


def test_mqtt_and_webhooks_from_a_file(tmp_path: Path) -> None:
    config = load(tmp_path, '[mqtt]\nurl = "mqtts://broker.lan"\nusername = "cam"\n'
                  '[[webhook]]\nurl = "http://127.0.0.1:9/hook"\nevents = ["viewer_joined"]\n'
                  'secret = "s"\n[[webhook]]\nurl = "https://example.invalid/x"\n')
    assert config.mqtt.endpoint() == ("broker.lan", 8883, True)  # type: ignore[attr-defined]
    hooks = config.webhook  # type: ignore[attr-defined]
    assert [h.events for h in hooks] == [("viewer_joined",), ()]
    again = load(tmp_path, to_toml(config))  # type: ignore[arg-type]
    assert again == config


@pytest.mark.parametrize(("text", "names"), [
    ('[mqtt]\nurl = "http://broker"\n', "mqtt.url"),
    ('[mqtt]\nurl = "mqtt://broker:99999"\n', "mqtt.url"),
    ('[mqtt]\nurl = "mqtt://"\n', "mqtt.url"),
    ('[mqtt]\nurl = "mqtt://cam:s3cret@broker"\n', "mqtt.username"),
    ('[mqtt]\ntopic_prefix = "a/#"\n', "mqtt.topic_prefix"),
    ('[mqtt]\nstate_interval_s = 0\n', "mqtt.state_interval_s"),
    ('[mqtt]\nbroker = "x"\n', "mqtt.broker"),
    ('[[webhook]]\nurl = "ftp://x"\n', "webhook[0].url"),
    ('[[webhook]]\nurl = "http://x/"\nevents = ["nope"]\n', "webhook[0].events"),
    ('[[webhook]]\nurl = "http://x/"\nqueue_size = 0\n', "webhook[0].queue_size"),
    ('[[webhook]]\nurl = "http://x/"\nretries = "3"\n', "webhook[0].retries"),
    ('[[webhook]]\nurl = "http://x/"\nsecrte = "3"\n', "webhook.secrte"),
])
def test_bad_values_name_the_key(tmp_path: Path, text: str, names: str) -> None:
    with pytest.raises(ConfigError) as error:
        load(tmp_path, text)
    message = str(error.value)
    assert names in message and "\n" not in message


def test_bad_mqtt_flag_exits_2_with_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruseon_appliance", "config", "--config", "/dev/null",
         "--mqtt", "tcp://broker"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "mqtt.url" in result.stderr, result.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "ruseon_appliance", "config", "--config", "/dev/null",
         "--mqtt", "mqtt://127.0.0.1:1884"], capture_output=True, text=True, timeout=60,
        check=False)
    assert ok.returncode == 0 and 'url = "mqtt://127.0.0.1:1884"' in ok.stdout


def test_tls_files_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    """A CA, certificate or key that cannot be used is a one-line error naming the setting when
    the config loads, not a failed connection attempt every minute later."""
    ca = CertificateAuthority(tmp_path, "home")
    client = ca.issue("camera", client=True)
    stranger = ca.issue("stranger", client=True)
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    url = 'url = "mqtts://broker.lan"\n'
    bad = [
        (f'[mqtt]\nurl = "mqtt://broker.lan"\nca_file = "{ca.cert}"\n', "mqtt.ca_file",
         "mqtts://"),
        (f'[mqtt]\n{url}ca_file = "{tmp_path / "missing.pem"}"\n', "mqtt.ca_file",
         "cannot be read"),
        (f'[mqtt]\n{url}ca_file = "{not_pem}"\n', "mqtt.ca_file", "PEM"),
        (f'[mqtt]\n{url}key_file = "{client.key}"\n', "mqtt.key_file", "cert_file"),
        (f'[mqtt]\n{url}cert_file = "{client.cert}"\nkey_file = "{stranger.key}"\n',
         "mqtt.cert_file", "client certificate"),
        (f'[[webhook]]\nurl = "http://127.0.0.1:9/x"\nca_file = "{ca.cert}"\n',
         "webhook[0].ca_file", "https://"),
        (f'[[webhook]]\nurl = "https://127.0.0.1:9/x"\nca_file = "{not_pem}"\n',
         "webhook[0].ca_file", "PEM"),
    ]
    for text, key, reason in bad:
        with pytest.raises(ConfigError) as error:
            load(tmp_path, text)
        message = str(error.value)
        assert key in message and reason in message and "\n" not in message, (text, message)
    good = load(tmp_path, f'[mqtt]\n{url}ca_file = "{ca.cert}"\ncert_file = "{client.cert}"\n'
                f'key_file = "{client.key}"\n[[webhook]]\nurl = "https://h/x"\n'
                f'ca_file = "{ca.cert}"\n')
    assert good.mqtt.tls_context() is not None  # type: ignore[attr-defined]
    assert load(tmp_path, to_toml(good)) == good  # type: ignore[arg-type]


async def test_a_late_acknowledgement_is_a_warning_not_a_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    """A SUBACK for a message id aiomqtt no longer waits for (seen in CI right after a broker
    restart) used to put a KeyError traceback in the journal: now one warning line."""
    import logging

    from ruseon_appliance.config import MqttConfig
    from ruseon_appliance.mqtt.publisher import HomeAssistantMqtt

    async def no_snapshot() -> None:
        return None

    publisher = HomeAssistantMqtt(MqttConfig(url="mqtt://127.0.0.1:1"), device_id="d", name="n",
                                  state=dict, snapshot=no_snapshot)
    client = publisher._client(*await publisher._load_credentials())
    with caplog.at_level(logging.DEBUG):
        client._on_subscribe(client._client, None, 23, [])
        client._on_unsubscribe(client._client, None, 24, [])
    records = [r for r in caplog.records if "Unexpected message ID" in r.getMessage()]
    assert [r.getMessage() for r in records] == [
        'Unexpected message ID "23" in on_subscribe callback',
        'Unexpected message ID "24" in on_unsubscribe callback']
    assert all(r.levelname == "WARNING" and r.exc_info is None for r in records), records
    assert "Traceback" not in caplog.text
