"""The STk paper's synthetic experiments (§4): the top-k sum solvers of Table 1
(:mod:`topklab.synthetic.topk_sum`), Gaussian data, the LDA boundary, ParaF1 and population training of
logistic regression (Table 2, Figures 3 and 4)."""

from topklab.synthetic.gaussian import COVARIANCES, GaussianTask, SyntheticSplit, toeplitz_covariance
from topklab.synthetic.lda import lda_boundary
from topklab.synthetic.paraf1 import para_f1, support

__all__ = ["COVARIANCES", "GaussianTask", "SyntheticSplit", "lda_boundary", "para_f1", "support", "toeplitz_covariance"]
