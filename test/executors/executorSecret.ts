import { credentialHeaders } from "../../src/control/executor-calls/ExecutorHttp.js"
import { internalSecretEnv } from "../../src/sidecar/InternalSecret.js"

/**
 * The internal secret the executors of these tests are started with, as the node agent starts
 * them: in their environment. Every call but a health probe carries it, as the dispatcher's do.
 */
export const testSecret = "executor-tests-internal-secret"
export const secretEnv = internalSecretEnv(testSecret)
export const authorized = credentialHeaders(testSecret)

/** POSTs `body` as JSON with the secret; answers the status and the decoded JSON answer. */
export const postAuthorized = async <T>(
  url: string,
  body: unknown
): Promise<{ readonly status: number; readonly body: T }> => {
  const response = await fetch(url, {
    method: "POST",
    headers: { ...authorized, "content-type": "application/json" },
    body: JSON.stringify(body)
  })
  return { status: response.status, body: (await response.json()) as T }
}
