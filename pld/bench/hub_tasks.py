"""The method's datasets from the Hugging Face Hub (needs the network and
``pip install datasets``): CNN/DailyMail for summarization, HAGRID for
context QA (all quotes joined into one context, as in the method), MT-Bench
for two-turn chat. Each record becomes a :class:`~pld.bench.tasks.Prompt`
through a formatter that is a plain function of the record, so the formats
are testable offline."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

from .tasks import Prompt

SUMMARY = "Summarize the following news article in a few sentences.\n\nArticle:\n{article}"
CONTEXT_QA = ("Answer the question using only the context below.\n\nContext:\n{context}\n\n"
              "Question: {question}")


def cnn_dailymail(record: Mapping[str, Any], i: int) -> Prompt:
    return Prompt(id=f"hub/cnn_dailymail/{record.get('id', i)}", task="summarization",
                  category="cnn_dailymail", turns=(SUMMARY.format(article=record["article"].strip()),),
                  source="hub")


def hagrid(record: Mapping[str, Any], i: int) -> Prompt:
    context = "\n\n".join(q["text"].strip() for q in record["quotes"])
    return Prompt(id=f"hub/hagrid/{record.get('query_id', i)}", task="rag", category="hagrid",
                  turns=(CONTEXT_QA.format(context=context, question=record["query"].strip()),),
                  source="hub")


def mt_bench(record: Mapping[str, Any], i: int) -> Prompt:
    turns = tuple(record["prompt"][:2])
    return Prompt(id=f"hub/mt_bench/{record.get('prompt_id', i)}", task="chat",
                  category=record.get("category", "mt_bench"), turns=turns, source="hub")


#: task -> (dataset id, config, split, formatter)
DATASETS: Dict[str, Tuple[str, Any, str, Callable[[Mapping[str, Any], int], Prompt]]] = {
    "summarization": ("abisee/cnn_dailymail", "3.0.0", "test", cnn_dailymail),
    "rag": ("miracl/hagrid", None, "dev", hagrid),
    "chat": ("HuggingFaceH4/mt_bench_prompts", None, "train", mt_bench),
}


def prompts(tasks: Sequence[str], limit: int) -> List[Prompt]:
    """The first prompts of each task's dataset; every task must be one of
    :data:`DATASETS` (pld.bench.tasks.load checks). A ValueError naming
    --source where ``datasets`` is not installed."""
    try:
        import datasets
    except ImportError:
        raise ValueError("--source hub: needs `pip install datasets` and the network "
                         "(--source builtin works offline)") from None
    out: List[Prompt] = []
    for t in tasks:
        name, config, split, fmt = DATASETS[t]
        # chat: take every category's share, so read the whole (small) set
        n = None if t == "chat" else limit
        ds = datasets.load_dataset(name, config, split=split if n is None else f"{split}[:{n}]")
        out.extend(fmt(r, i) for i, r in enumerate(ds))
    return out
