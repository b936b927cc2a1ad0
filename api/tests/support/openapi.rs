//! The api's OpenAPI document as the tests read it: only the parts they check, typed. (utoipa's
//! own types do not read back every schema it writes, e.g. one with only a description.)

// Each test file that includes this reads a part of it.
#![allow(dead_code)]

use serde::Deserialize;
use serde::de::IgnoredAny;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
pub struct Document {
    pub openapi: String,
    /// Path → method (`get`, `post`, …) → operation.
    pub paths: BTreeMap<String, BTreeMap<String, Operation>>,
    pub components: Components,
}

#[derive(Debug, Deserialize)]
pub struct Operation {
    #[serde(default)]
    pub parameters: Vec<Parameter>,
    /// Status → response.
    #[serde(default)]
    pub responses: BTreeMap<String, IgnoredAny>,
}

#[derive(Debug, Deserialize)]
pub struct Parameter {
    pub name: String,
    pub schema: ParameterSchema,
}

#[derive(Debug, Deserialize)]
pub struct ParameterSchema {
    pub pattern: Option<String>,
    #[serde(rename = "$ref")]
    pub reference: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct Components {
    pub schemas: BTreeMap<String, SchemaDoc>,
    #[serde(rename = "securitySchemes", default)]
    pub security_schemes: BTreeMap<String, IgnoredAny>,
}

#[derive(Debug, Deserialize)]
pub struct SchemaDoc {
    /// A named set's names.
    #[serde(rename = "enum")]
    pub names: Option<Vec<String>>,
}

impl Document {
    /// The names set `name` is documented with.
    pub fn names(&self, set: &str) -> Vec<String> {
        let schema = self.components.schemas.get(set);
        let names = schema.and_then(|s| s.names.clone());
        names.unwrap_or_else(|| panic!("{set} is not an enum"))
    }

    /// The documented parameters of `method` on `path`.
    pub fn parameters(&self, path: &str, method: &str) -> &[Parameter] {
        let operation = self.paths.get(path).and_then(|item| item.get(method));
        let operation = operation.unwrap_or_else(|| panic!("{method} {path} is not documented"));
        &operation.parameters
    }
}
