/**
 * The bodies the gateway's admin routes take (`AdminApi.ts`), apart from their answers
 * (`GatewayAnswers.ts`): these check what the platform keeps of an app, so they import its store.
 */
import * as Schema from "effect/Schema"
import { AdmissionOverride, OutboundHosts, RequestTimeoutMs } from "../app-manager/AppStore.js"

/** `POST /app/register` */
export const RegisterRequest = Schema.Struct({
  source: Schema.String,
  name: Schema.String,
  replace: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  /** Admission settings over the app's own (defineApp's `admission`). */
  admission: Schema.optional(AdmissionOverride),
  /** Keys this app's invoke and OpenAI routes take, besides the platform's (`--api-key`); kept as digests. */
  apiKeys: Schema.optional(
    Schema.Array(
      Schema.String.pipe(
        Schema.pattern(/^[\x21-\x7e]{16,256}$/, {
          message: () => "an API key is 16 to 256 printable ASCII characters, no spaces"
        })
      )
    ).pipe(Schema.maxItems(16))
  ),
  /** Hosts the app may connect to (`host` or `host:port`), through its outbound proxy. */
  allowHosts: Schema.optional(OutboundHosts),
  /** How long the app's requests may take, streams included, in ms; over the app's own `timeoutMs`. */
  timeoutMs: Schema.optional(RequestTimeoutMs)
})

/** `POST /task/scale` */
export const ScaleRequest = Schema.Struct({
  taskId: Schema.String,
  devices: Schema.Int.pipe(
    Schema.filter((n) => n !== 0 || "devices must be a non-zero whole number (+ adds, - removes)")
  )
})
