"""Remote model sources: s3://, gs://, hf://, oci://, https:// (one module per scheme), the
content-keyed cache they download into, and the fetcher that framework workers ask
(``hotset_worker.frameworks.sources.folder``). The URI grammar and the source policy live in
``hotset_common.sources``."""
