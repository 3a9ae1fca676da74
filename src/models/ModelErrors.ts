import * as Schema from "effect/Schema"

/**
 * Why a model id does not give a model directory: each a tagged error with what a user needs to
 * act on it (the id, the hub endpoint asked, the places looked in).
 */

export class UnknownModel extends Schema.TaggedError<UnknownModel>()("UnknownModel", {
  id: Schema.String,
  reason: Schema.String
}) {
  override get message() {
    return `model "${this.id}": ${this.reason}`
  }
}

/** The hub has no such repository, revision or file (404). */
export class HubModelNotFound extends Schema.TaggedError<HubModelNotFound>()("HubModelNotFound", {
  id: Schema.String,
  endpoint: Schema.String,
  detail: Schema.String
}) {
  override get message() {
    return `model "${this.id}" was not found on ${this.endpoint}: ${this.detail}`
  }
}

/** The hub refused the request (401, 403): a private or gated repository, or a token that cannot read it. */
export class HubAccessDenied extends Schema.TaggedError<HubAccessDenied>()("HubAccessDenied", {
  id: Schema.String,
  endpoint: Schema.String,
  status: Schema.Int,
  tokenSent: Schema.Boolean,
  detail: Schema.String
}) {
  override get message() {
    const advice = this.tokenSent
      ? "HF_TOKEN was sent but cannot read it (a gated repository needs its terms accepted on the hub first)"
      : "it may be private, gated or misspelt; set HF_TOKEN to a token that can read it"
    return `${this.endpoint} refused access to model "${this.id}" (${this.status}${this.detail === "" ? "" : `: ${this.detail}`}): ${advice}`
  }
}

/** The hub could not be reached, failed, or a transfer kept breaking off. */
export class HubRequestFailed extends Schema.TaggedError<HubRequestFailed>()("HubRequestFailed", {
  id: Schema.String,
  endpoint: Schema.String,
  reason: Schema.String
}) {
  override get message() {
    return `downloading model "${this.id}" from ${this.endpoint} failed: ${this.reason}`
  }
}

/** A downloaded file does not have the digest the hub lists for it; it was deleted. */
export class ModelChecksumMismatch extends Schema.TaggedError<ModelChecksumMismatch>()("ModelChecksumMismatch", {
  id: Schema.String,
  file: Schema.String,
  algorithm: Schema.String,
  expected: Schema.String,
  actual: Schema.String
}) {
  override get message() {
    return (
      `model "${this.id}": ${this.file} arrived with ${this.algorithm} ${this.actual} but the hub lists ` +
      `${this.expected}; the file was removed (run again to download it afresh)`
    )
  }
}

/** The model is not on this machine, and downloads are turned off. */
export class ModelOffline extends Schema.TaggedError<ModelOffline>()("ModelOffline", {
  id: Schema.String,
  searched: Schema.Array(Schema.String)
}) {
  override get message() {
    return (
      `model "${this.id}" is not on this machine and downloads are off (--offline or HF_HUB_OFFLINE=1); ` +
      `looked in ${this.searched.join(" and ")}`
    )
  }
}

/** The model has no ONNX files at the precision asked for. */
export class DtypeUnavailable extends Schema.TaggedError<DtypeUnavailable>()("DtypeUnavailable", {
  id: Schema.String,
  dtype: Schema.String,
  available: Schema.Array(Schema.String)
}) {
  override get message() {
    return this.available.length === 0
      ? `model "${this.id}" has no ONNX files under onnx/ (Cornserve runs transformers.js-style ONNX exports)`
      : `model "${this.id}" has no ONNX files at dtype ${this.dtype}; it has ${this.available.join(", ")}`
  }
}
