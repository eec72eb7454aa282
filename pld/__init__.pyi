from typing import Any, ContextManager

from ._core import NgramIndex as NgramIndex
from ._core import accept_greedy as accept_greedy
from ._core import accept_sample as accept_sample
from .config import DecodeConfig as DecodeConfig
from .corpus import Corpus as Corpus
from .corpus import tokenizer_fingerprint as tokenizer_fingerprint
from .generate import Generation as Generation
from .generate import generate as generate
from .candidate_generator import PromptLookupCandidateGenerator as PromptLookupCandidateGenerator
from .from_generate import disable as disable
from .from_generate import enable as enable
from .from_generate import enabled as enabled
from .from_generate import is_enabled as is_enabled
from .lookup import find_candidate_pred_tokens as find_candidate_pred_tokens

from . import bench as bench
from . import drafts as drafts
from . import models as models

__version__: str
POLICIES: tuple
SEMANTICS: tuple
