"""Where slot states live: llama-server's prompt cache rules, the disk tier and the tiered cache over both.

Importing `caches` (or any of these modules) does not load llama.cpp; the llama_cache API for
llama-cpp-python users is the subpackage `caches.llama_cache`, which does.
"""

from caches.disk.tier import DiskTier as DiskTier
from caches.disk.tier import DiskTierStats as DiskTierStats
from caches.prompt_cache import Entry as Entry
from caches.prompt_cache import PromptCache as PromptCache
from caches.prompt_cache import PromptCacheStats as PromptCacheStats
from caches.prompt_cache import default_limit_bytes as default_limit_bytes
from caches.tiered import TieredCache as TieredCache
from caches.tiered import TieredCacheStats as TieredCacheStats
from caches.tokens import lcp as lcp
