"""morph.qwen.compat_transformers: each shim is fed a fake with the 5.x shape, so the feature detection is
exercised on any transformers."""

import pytest

from morph.qwen import compat_transformers as shims


def _decorator_5x(func):  # the shape of check_model_inputs on transformers >= 5.4
    func.decorated = True
    return func


def _decorator_457(tie_last_hidden_states=True):  # the shape on 4.57: always called
    return _decorator_5x


def test_feature_detection_tells_the_two_decorator_signatures_apart():
    assert shims._needs_func_argument(_decorator_5x)
    assert not shims._needs_func_argument(_decorator_457)


def test_wrapped_decorator_accepts_both_call_forms():
    wrapped = shims.accepts_both_call_forms(_decorator_5x)

    @wrapped
    def bare():
        pass

    @wrapped()
    def called():
        pass

    @wrapped(tie_last_hidden_states=False)
    def with_kwargs():
        pass

    assert bare.decorated and called.decorated and with_kwargs.decorated
    with pytest.raises(TypeError):
        _decorator_5x()  # what qwen-tts's `@check_model_inputs()` hits without the shim


@pytest.fixture(autouse=True)
def _own_rebinding_record(monkeypatch):
    """Each test's check_model_inputs rebinding is its own (monkeypatch restores transformers' attribute)."""
    monkeypatch.setattr(shims, "_rebound", [])


def test_check_model_inputs_shim_patches_a_5x_decorator_once(monkeypatch):
    from transformers.utils import generic

    monkeypatch.setattr(generic, "check_model_inputs", _decorator_5x)
    assert shims._shim_check_model_inputs()
    patched = generic.check_model_inputs
    assert patched is not _decorator_5x
    assert patched()(lambda: None).decorated
    assert not shims._shim_check_model_inputs()  # idempotent
    assert generic.check_model_inputs is patched


def test_check_model_inputs_shim_leaves_a_457_decorator_alone(monkeypatch):
    from transformers.utils import generic

    monkeypatch.setattr(generic, "check_model_inputs", _decorator_457)
    assert not shims._shim_check_model_inputs()
    assert generic.check_model_inputs is _decorator_457


def test_check_model_inputs_shim_restores_a_removed_decorator(monkeypatch):
    from transformers.utils import generic

    monkeypatch.delattr(generic, "check_model_inputs", raising=False)
    monkeypatch.setattr(generic, "merge_with_config_defaults", _decorator_5x, raising=False)
    assert shims._shim_check_model_inputs()
    assert generic.check_model_inputs()(lambda: None).decorated


def test_check_model_inputs_is_given_back_after_the_import(monkeypatch):
    from transformers.utils import generic

    monkeypatch.setattr(generic, "check_model_inputs", _decorator_5x)
    assert shims._shim_check_model_inputs() and generic.check_model_inputs is not _decorator_5x
    shims.restore_check_model_inputs()
    assert generic.check_model_inputs is _decorator_5x
    monkeypatch.delattr(generic, "check_model_inputs")
    monkeypatch.setattr(generic, "merge_with_config_defaults", _decorator_5x, raising=False)
    assert shims._shim_check_model_inputs()
    shims.restore_check_model_inputs()
    assert not hasattr(generic, "check_model_inputs")  # removed again, as this transformers has it
