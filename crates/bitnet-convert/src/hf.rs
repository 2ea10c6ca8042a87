//! A Hugging Face model directory: `config.json`, the safetensors checkpoint (one file, or shards
//! with `model.safetensors.index.json`), `tokenizer.json` and `tokenizer_config.json`.
//!
//! Shards are memory-mapped; each one's header is validated by the `safetensors` crate at open
//! (header length, JSON, contiguous non-overlapping offsets, bytes = elements × dtype size).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use bitnet_gguf::MappedFile;
use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;
use serde::Deserialize;

use crate::error::ConvertError;

/// The keys of `config.json` the converter reads (others are ignored).
#[derive(Debug, Clone, Deserialize)]
pub struct HfConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    #[serde(default)]
    pub model_type: Option<String>,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    #[serde(default)]
    pub num_key_value_heads: Option<u64>,
    #[serde(default)]
    pub head_dim: Option<u64>,
    pub max_position_embeddings: u64,
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    pub vocab_size: u64,
    #[serde(default)]
    pub hidden_act: Option<String>,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub bos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pub pad_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pub quantization_config: Option<serde_json::Value>,
    #[serde(default, rename = "_name_or_path")]
    pub name_or_path: Option<String>,
}

/// A tensor's place in the checkpoint.
#[derive(Debug, Clone)]
pub struct HfTensor {
    shard: usize,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

struct Shard {
    path: PathBuf,
    map: MappedFile,
    header_len: usize,
    metadata: Metadata,
}

/// An opened Hugging Face model directory.
pub struct HfDir {
    pub dir: PathBuf,
    pub config: HfConfig,
    /// `config.json` as read, for the keys [`HfConfig`] does not name.
    pub raw_config: serde_json::Value,
    shards: Vec<Shard>,
    tensors: BTreeMap<String, HfTensor>,
}

impl std::fmt::Debug for HfDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfDir")
            .field("dir", &self.dir)
            .field("shards", &self.shards.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// Whether `path` looks like a Hugging Face model directory.
pub fn is_hf_dir(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ConvertError> {
    let text = std::fs::read_to_string(path).map_err(ConvertError::io(path))?;
    serde_json::from_str(&text).map_err(|source| ConvertError::Json {
        path: path.to_path_buf(),
        source,
    })
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

impl HfDir {
    /// Open the directory: parse `config.json`, map and validate every shard.
    pub fn open(dir: &Path) -> Result<Self, ConvertError> {
        let config_path = dir.join("config.json");
        let raw_config: serde_json::Value = read_json(&config_path)?;
        let config: HfConfig =
            serde_json::from_value(raw_config.clone()).map_err(|source| ConvertError::Json {
                path: config_path,
                source,
            })?;
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let (files, index) = if single.is_file() {
            (vec![single], None)
        } else if index_path.is_file() {
            let index: ShardIndex = read_json(&index_path)?;
            let mut files: Vec<PathBuf> = Vec::new();
            for file in index.weight_map.values() {
                // Shard names are plain file names inside the directory.
                let ok = !file.is_empty()
                    && Path::new(file).file_name().and_then(|n| n.to_str()) == Some(file.as_str());
                if !ok {
                    return Err(ConvertError::Index {
                        path: index_path,
                        why: format!("shard name {file:?} is not a file name in the directory"),
                    });
                }
                let p = dir.join(file);
                if !files.contains(&p) {
                    files.push(p);
                }
            }
            (files, Some((index_path, index.weight_map)))
        } else {
            return Err(ConvertError::UnknownInput {
                path: dir.to_path_buf(),
            });
        };

        let mut shards = Vec::with_capacity(files.len());
        let mut tensors: BTreeMap<String, HfTensor> = BTreeMap::new();
        for (si, path) in files.into_iter().enumerate() {
            let map = MappedFile::open(&path).map_err(|e| match e {
                bitnet_gguf::GgufError::Io(source) => ConvertError::Io {
                    path: path.clone(),
                    source,
                },
                other => ConvertError::Gguf(other),
            })?;
            let (header_len, metadata) =
                SafeTensors::read_metadata(map.as_bytes()).map_err(|source| {
                    ConvertError::Safetensors {
                        path: path.clone(),
                        source,
                    }
                })?;
            for (name, info) in metadata.tensors() {
                let t = HfTensor {
                    shard: si,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                };
                if tensors.insert(name.clone(), t).is_some() {
                    return Err(ConvertError::Index {
                        path: path.clone(),
                        why: format!("tensor {name:?} is in more than one shard"),
                    });
                }
            }
            shards.push(Shard {
                path,
                map,
                header_len,
                metadata,
            });
        }
        if let Some((index_path, weight_map)) = index {
            for (name, file) in &weight_map {
                let t = tensors.get(name).ok_or_else(|| ConvertError::Index {
                    path: index_path.clone(),
                    why: format!("tensor {name:?} is not in {file}"),
                })?;
                if shards[t.shard].path.file_name().and_then(|n| n.to_str()) != Some(file) {
                    return Err(ConvertError::Index {
                        path: index_path.clone(),
                        why: format!("tensor {name:?} is listed in {file} but stored elsewhere"),
                    });
                }
            }
        }
        Ok(HfDir {
            dir: dir.to_path_buf(),
            config,
            raw_config,
            shards,
            tensors,
        })
    }

    /// The shard file holding tensor `name` (the directory when it has none).
    pub fn shard_path(&self, name: &str) -> &Path {
        self.tensors
            .get(name)
            .and_then(|t| self.shards.get(t.shard))
            .map_or(self.dir.as_path(), |s| s.path.as_path())
    }

    /// The tensor's entry, if the checkpoint has it.
    pub fn get(&self, name: &str) -> Option<&HfTensor> {
        self.tensors.get(name)
    }

    /// The tensor's entry, or a typed error naming it.
    pub fn require(&self, name: &str) -> Result<&HfTensor, ConvertError> {
        self.get(name)
            .ok_or_else(|| ConvertError::MissingTensor(name.to_string()))
    }

    /// The bytes of a tensor (exactly elements × dtype size, as validated at open).
    pub fn data(&self, name: &str) -> Result<&[u8], ConvertError> {
        let t = self.require(name)?;
        let shard = &self.shards[t.shard];
        let info = shard
            .metadata
            .info(name)
            .ok_or_else(|| ConvertError::MissingTensor(name.to_string()))?;
        let (start, end) = info.data_offsets;
        let base = 8usize.checked_add(shard.header_len);
        let range = base.and_then(|b| Some(b.checked_add(start)?..b.checked_add(end)?));
        range
            .and_then(|r| shard.map.as_bytes().get(r))
            .ok_or_else(|| ConvertError::Index {
                path: shard.path.clone(),
                why: format!("tensor {name:?} lies outside the file"),
            })
    }

    /// A float tensor (BF16, F16 or F32) widened to f32, checked for NaN/Inf and shape.
    pub fn floats(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ConvertError> {
        let t = self.require(name)?;
        check_shape(name, &t.shape, shape)?;
        let bytes = self.data(name)?;
        let v: Vec<f32> = match t.dtype {
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            other => {
                return Err(ConvertError::Dtype {
                    name: name.to_string(),
                    expected: "BF16, F16 or F32",
                    found: format!("{other:?}"),
                })
            }
        };
        if let Some(index) = v.iter().position(|x| !x.is_finite()) {
            return Err(ConvertError::NonFinite {
                name: name.to_string(),
                index,
            });
        }
        Ok(v)
    }

    /// Every tensor name (sorted).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }
}

pub(crate) fn check_shape(
    name: &str,
    found: &[usize],
    expected: &[usize],
) -> Result<(), ConvertError> {
    if found != expected {
        return Err(ConvertError::Shape {
            name: name.to_string(),
            expected: expected.to_vec(),
            found: found.to_vec(),
        });
    }
    Ok(())
}

/// An integer id given as a number or a list of numbers (the first counts).
pub(crate) fn json_id(v: &serde_json::Value) -> Option<u32> {
    match v {
        serde_json::Value::Number(n) => n.as_u64().and_then(|x| u32::try_from(x).ok()),
        serde_json::Value::Array(a) => a.first().and_then(json_id),
        _ => None,
    }
}

/// Map from name to value of a few small JSON files (tokenizer_config.json) kept loosely typed.
pub(crate) type JsonMap = HashMap<String, serde_json::Value>;
