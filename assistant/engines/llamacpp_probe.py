"""Proves that the installed llama.cpp library decodes on this machine, in a process of its own.

``python -m assistant.engines.llamacpp_probe`` loads the shipped model, decodes a few tokens and
prints the CPU features llama.cpp reports. It exits 0 when that worked. A library built for
features the CPU lists but the process may not use (AMX tiles the kernel never enabled) dies on
the first decode with SIGSEGV or SIGILL, so its caller sees a signal instead: scripts/setup runs
this before it keeps a native build. Nothing here imports Django.
"""

import sys

from assistant.engines.llamacpp import default_model_path


def system_info() -> str:
    """llama.cpp's own line of CPU features compiled into the loaded library."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode()


def main() -> int:
    from llama_cpp import Llama

    llama = Llama(model_path=str(default_model_path()), n_ctx=256, n_threads=1, verbose=False)
    out = llama.create_completion("The sky is", max_tokens=4, temperature=0.0)
    text = out["choices"][0]["text"]
    print(f"llama.cpp decoded {text!r}; {system_info()}")
    return 0 if out["usage"]["completion_tokens"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
