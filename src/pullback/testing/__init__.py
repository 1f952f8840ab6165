from .gradcheck import check_grad, check_second_order, to_float64  # noqa: F401
from . import programs  # noqa: F401,E402
