import os, pytest
pytestmark = pytest.mark.kernel

def test_pass():
    assert os.environ["DQOES_GUEST"] == "1"

def test_fail():
    print("some captured output")
    assert 1 + 1 == 3

def test_skip():
    pytest.skip("guest says skip")

@pytest.mark.skipif(True, reason="skipif in guest")
def test_skipif():
    pass

@pytest.mark.xfail(reason="known bad")
def test_xfail():
    assert False

@pytest.mark.parametrize("x", [1, 2])
def test_param(x, cgroup_root):
    assert cgroup_root.is_dir()

@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")

def test_setup_error(broken):
    pass

class TestK:
    def test_method(self):
        pass

def test_host_only_not_kernel():
    pass
test_host_only_not_kernel.pytestmark = []

def test_zz_dies():
    os.system("busybox poweroff -f")
    import time; time.sleep(30)

def test_zz_after():
    pass
