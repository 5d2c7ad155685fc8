/** Every credential the tests hand the gateway or send as a client: none may appear in any gateway log line. */
export const TEST_SECRETS = ['sk-test-stormgate-0123456789', 'backup-key', 'client-secret', 'sk-client-not-a-provider-key', 'client-x-api-key', 'client-azure-key', 'echoing-key', 'files-key', 'slow-key', 'thinking-key', 'zipped-key', 'ABSKcmV2aWV3/Y2ZnLWtleQ+0123=', 'sg-client-agents-key', 'sg-client-batch-key', 'sg-wrong-guess-key', 'azure-key-0123456789abcdef0123456789', 'egress-proxy-password-7f3a', 'sk-misconfigured-key-4242', 'sk-au48/Zm9v+YmFy<key=0123', 'sk-pentest-live-4f9a1c7e2b8d6a3f5e0c', 'sk-ant-pentest-9b2e7d4c1a6f3e8b0d5c', 'sg-pentest-agents-key-31d7', 'sg-pentest-batch-key-8c2e', 'sk-proj-provider-secret-abcdef0123456789', 'sk-s27-provider-0123456789abcdef', 'sg-s27-agents-key-0123456789', 'sg-s27-wrong-guess'];

/** Where every gateway started by the tests also writes its log lines (fresh for each run). */
export const TEST_LOG_DIR = '.tmp/test-logs';
