package dev.snowkeep.v1;

import static io.grpc.MethodDescriptor.generateFullMethodName;

/**
 * <pre>
 * Describes the server: version, layout, held machine ids and fences, and
 * decodes ids.
 * </pre>
 */
@io.grpc.stub.annotations.GrpcGenerated
public final class InfoServiceGrpc {

  private InfoServiceGrpc() {}

  public static final java.lang.String SERVICE_NAME = "snowkeep.v1.InfoService";

  // Static method descriptors that strictly reflect the proto.
  private static volatile io.grpc.MethodDescriptor<dev.snowkeep.v1.GetInfoRequest,
      dev.snowkeep.v1.GetInfoResponse> getGetInfoMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "GetInfo",
      requestType = dev.snowkeep.v1.GetInfoRequest.class,
      responseType = dev.snowkeep.v1.GetInfoResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<dev.snowkeep.v1.GetInfoRequest,
      dev.snowkeep.v1.GetInfoResponse> getGetInfoMethod() {
    io.grpc.MethodDescriptor<dev.snowkeep.v1.GetInfoRequest, dev.snowkeep.v1.GetInfoResponse> getGetInfoMethod;
    if ((getGetInfoMethod = InfoServiceGrpc.getGetInfoMethod) == null) {
      synchronized (InfoServiceGrpc.class) {
        if ((getGetInfoMethod = InfoServiceGrpc.getGetInfoMethod) == null) {
          InfoServiceGrpc.getGetInfoMethod = getGetInfoMethod =
              io.grpc.MethodDescriptor.<dev.snowkeep.v1.GetInfoRequest, dev.snowkeep.v1.GetInfoResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "GetInfo"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dev.snowkeep.v1.GetInfoRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dev.snowkeep.v1.GetInfoResponse.getDefaultInstance()))
              .setSchemaDescriptor(new InfoServiceMethodDescriptorSupplier("GetInfo"))
              .build();
        }
      }
    }
    return getGetInfoMethod;
  }

  private static volatile io.grpc.MethodDescriptor<dev.snowkeep.v1.DecodeIdRequest,
      dev.snowkeep.v1.DecodeIdResponse> getDecodeIdMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "DecodeId",
      requestType = dev.snowkeep.v1.DecodeIdRequest.class,
      responseType = dev.snowkeep.v1.DecodeIdResponse.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<dev.snowkeep.v1.DecodeIdRequest,
      dev.snowkeep.v1.DecodeIdResponse> getDecodeIdMethod() {
    io.grpc.MethodDescriptor<dev.snowkeep.v1.DecodeIdRequest, dev.snowkeep.v1.DecodeIdResponse> getDecodeIdMethod;
    if ((getDecodeIdMethod = InfoServiceGrpc.getDecodeIdMethod) == null) {
      synchronized (InfoServiceGrpc.class) {
        if ((getDecodeIdMethod = InfoServiceGrpc.getDecodeIdMethod) == null) {
          InfoServiceGrpc.getDecodeIdMethod = getDecodeIdMethod =
              io.grpc.MethodDescriptor.<dev.snowkeep.v1.DecodeIdRequest, dev.snowkeep.v1.DecodeIdResponse>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "DecodeId"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dev.snowkeep.v1.DecodeIdRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dev.snowkeep.v1.DecodeIdResponse.getDefaultInstance()))
              .setSchemaDescriptor(new InfoServiceMethodDescriptorSupplier("DecodeId"))
              .build();
        }
      }
    }
    return getDecodeIdMethod;
  }

  private static volatile io.grpc.MethodDescriptor<dev.snowkeep.v1.GetCapacityRequest,
      dev.snowkeep.v1.Capacity> getGetCapacityMethod;

  @io.grpc.stub.annotations.RpcMethod(
      fullMethodName = SERVICE_NAME + '/' + "GetCapacity",
      requestType = dev.snowkeep.v1.GetCapacityRequest.class,
      responseType = dev.snowkeep.v1.Capacity.class,
      methodType = io.grpc.MethodDescriptor.MethodType.UNARY)
  public static io.grpc.MethodDescriptor<dev.snowkeep.v1.GetCapacityRequest,
      dev.snowkeep.v1.Capacity> getGetCapacityMethod() {
    io.grpc.MethodDescriptor<dev.snowkeep.v1.GetCapacityRequest, dev.snowkeep.v1.Capacity> getGetCapacityMethod;
    if ((getGetCapacityMethod = InfoServiceGrpc.getGetCapacityMethod) == null) {
      synchronized (InfoServiceGrpc.class) {
        if ((getGetCapacityMethod = InfoServiceGrpc.getGetCapacityMethod) == null) {
          InfoServiceGrpc.getGetCapacityMethod = getGetCapacityMethod =
              io.grpc.MethodDescriptor.<dev.snowkeep.v1.GetCapacityRequest, dev.snowkeep.v1.Capacity>newBuilder()
              .setType(io.grpc.MethodDescriptor.MethodType.UNARY)
              .setFullMethodName(generateFullMethodName(SERVICE_NAME, "GetCapacity"))
              .setSampledToLocalTracing(true)
              .setRequestMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dev.snowkeep.v1.GetCapacityRequest.getDefaultInstance()))
              .setResponseMarshaller(io.grpc.protobuf.ProtoUtils.marshaller(
                  dev.snowkeep.v1.Capacity.getDefaultInstance()))
              .setSchemaDescriptor(new InfoServiceMethodDescriptorSupplier("GetCapacity"))
              .build();
        }
      }
    }
    return getGetCapacityMethod;
  }

  /**
   * Creates a new async stub that supports all call types for the service
   */
  public static InfoServiceStub newStub(io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<InfoServiceStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<InfoServiceStub>() {
        @java.lang.Override
        public InfoServiceStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new InfoServiceStub(channel, callOptions);
        }
      };
    return InfoServiceStub.newStub(factory, channel);
  }

  /**
   * Creates a new blocking-style stub that supports all types of calls on the service
   */
  public static InfoServiceBlockingV2Stub newBlockingV2Stub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<InfoServiceBlockingV2Stub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<InfoServiceBlockingV2Stub>() {
        @java.lang.Override
        public InfoServiceBlockingV2Stub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new InfoServiceBlockingV2Stub(channel, callOptions);
        }
      };
    return InfoServiceBlockingV2Stub.newStub(factory, channel);
  }

  /**
   * Creates a new blocking-style stub that supports unary and streaming output calls on the service
   */
  public static InfoServiceBlockingStub newBlockingStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<InfoServiceBlockingStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<InfoServiceBlockingStub>() {
        @java.lang.Override
        public InfoServiceBlockingStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new InfoServiceBlockingStub(channel, callOptions);
        }
      };
    return InfoServiceBlockingStub.newStub(factory, channel);
  }

  /**
   * Creates a new ListenableFuture-style stub that supports unary calls on the service
   */
  public static InfoServiceFutureStub newFutureStub(
      io.grpc.Channel channel) {
    io.grpc.stub.AbstractStub.StubFactory<InfoServiceFutureStub> factory =
      new io.grpc.stub.AbstractStub.StubFactory<InfoServiceFutureStub>() {
        @java.lang.Override
        public InfoServiceFutureStub newStub(io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
          return new InfoServiceFutureStub(channel, callOptions);
        }
      };
    return InfoServiceFutureStub.newStub(factory, channel);
  }

  /**
   * <pre>
   * Describes the server: version, layout, held machine ids and fences, and
   * decodes ids.
   * </pre>
   */
  public interface AsyncService {

    /**
     * <pre>
     * Returns the server's version, namespace, layout, held machine ids and
     * server time. With authentication on, a call without an API key gets only
     * the version and the server time (servers' peer clock checks read it).
     * </pre>
     */
    default void getInfo(dev.snowkeep.v1.GetInfoRequest request,
        io.grpc.stub.StreamObserver<dev.snowkeep.v1.GetInfoResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getGetInfoMethod(), responseObserver);
    }

    /**
     * <pre>
     * Splits an id, given as a number or as its text (DecodeIdRequest.text),
     * into timestamp, machine id and sequence under the server's layout.
     * INVALID_ARGUMENT when the id is above the layout's largest,
     * 2^(timestamp_bits + machine_bits + sequence_bits) - 1, when both forms
     * are sent, or when the text is not an id of the layout.
     * </pre>
     */
    default void decodeId(dev.snowkeep.v1.DecodeIdRequest request,
        io.grpc.stub.StreamObserver<dev.snowkeep.v1.DecodeIdResponse> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getDecodeIdMethod(), responseObserver);
    }

    /**
     * <pre>
     * Counts the machine ids of the server's namespace range: total, held,
     * free. UNAVAILABLE when the store cannot be read.
     * </pre>
     */
    default void getCapacity(dev.snowkeep.v1.GetCapacityRequest request,
        io.grpc.stub.StreamObserver<dev.snowkeep.v1.Capacity> responseObserver) {
      io.grpc.stub.ServerCalls.asyncUnimplementedUnaryCall(getGetCapacityMethod(), responseObserver);
    }
  }

  /**
   * Base class for the server implementation of the service InfoService.
   * <pre>
   * Describes the server: version, layout, held machine ids and fences, and
   * decodes ids.
   * </pre>
   */
  public static abstract class InfoServiceImplBase
      implements io.grpc.BindableService, AsyncService {

    @java.lang.Override public final io.grpc.ServerServiceDefinition bindService() {
      return InfoServiceGrpc.bindService(this);
    }
  }

  /**
   * A stub to allow clients to do asynchronous rpc calls to service InfoService.
   * <pre>
   * Describes the server: version, layout, held machine ids and fences, and
   * decodes ids.
   * </pre>
   */
  public static final class InfoServiceStub
      extends io.grpc.stub.AbstractAsyncStub<InfoServiceStub> {
    private InfoServiceStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected InfoServiceStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new InfoServiceStub(channel, callOptions);
    }

    /**
     * <pre>
     * Returns the server's version, namespace, layout, held machine ids and
     * server time. With authentication on, a call without an API key gets only
     * the version and the server time (servers' peer clock checks read it).
     * </pre>
     */
    public void getInfo(dev.snowkeep.v1.GetInfoRequest request,
        io.grpc.stub.StreamObserver<dev.snowkeep.v1.GetInfoResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getGetInfoMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Splits an id, given as a number or as its text (DecodeIdRequest.text),
     * into timestamp, machine id and sequence under the server's layout.
     * INVALID_ARGUMENT when the id is above the layout's largest,
     * 2^(timestamp_bits + machine_bits + sequence_bits) - 1, when both forms
     * are sent, or when the text is not an id of the layout.
     * </pre>
     */
    public void decodeId(dev.snowkeep.v1.DecodeIdRequest request,
        io.grpc.stub.StreamObserver<dev.snowkeep.v1.DecodeIdResponse> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getDecodeIdMethod(), getCallOptions()), request, responseObserver);
    }

    /**
     * <pre>
     * Counts the machine ids of the server's namespace range: total, held,
     * free. UNAVAILABLE when the store cannot be read.
     * </pre>
     */
    public void getCapacity(dev.snowkeep.v1.GetCapacityRequest request,
        io.grpc.stub.StreamObserver<dev.snowkeep.v1.Capacity> responseObserver) {
      io.grpc.stub.ClientCalls.asyncUnaryCall(
          getChannel().newCall(getGetCapacityMethod(), getCallOptions()), request, responseObserver);
    }
  }

  /**
   * A stub to allow clients to do synchronous rpc calls to service InfoService.
   * <pre>
   * Describes the server: version, layout, held machine ids and fences, and
   * decodes ids.
   * </pre>
   */
  public static final class InfoServiceBlockingV2Stub
      extends io.grpc.stub.AbstractBlockingStub<InfoServiceBlockingV2Stub> {
    private InfoServiceBlockingV2Stub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected InfoServiceBlockingV2Stub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new InfoServiceBlockingV2Stub(channel, callOptions);
    }

    /**
     * <pre>
     * Returns the server's version, namespace, layout, held machine ids and
     * server time. With authentication on, a call without an API key gets only
     * the version and the server time (servers' peer clock checks read it).
     * </pre>
     */
    public dev.snowkeep.v1.GetInfoResponse getInfo(dev.snowkeep.v1.GetInfoRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getGetInfoMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Splits an id, given as a number or as its text (DecodeIdRequest.text),
     * into timestamp, machine id and sequence under the server's layout.
     * INVALID_ARGUMENT when the id is above the layout's largest,
     * 2^(timestamp_bits + machine_bits + sequence_bits) - 1, when both forms
     * are sent, or when the text is not an id of the layout.
     * </pre>
     */
    public dev.snowkeep.v1.DecodeIdResponse decodeId(dev.snowkeep.v1.DecodeIdRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getDecodeIdMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Counts the machine ids of the server's namespace range: total, held,
     * free. UNAVAILABLE when the store cannot be read.
     * </pre>
     */
    public dev.snowkeep.v1.Capacity getCapacity(dev.snowkeep.v1.GetCapacityRequest request) throws io.grpc.StatusException {
      return io.grpc.stub.ClientCalls.blockingV2UnaryCall(
          getChannel(), getGetCapacityMethod(), getCallOptions(), request);
    }
  }

  /**
   * A stub to allow clients to do limited synchronous rpc calls to service InfoService.
   * <pre>
   * Describes the server: version, layout, held machine ids and fences, and
   * decodes ids.
   * </pre>
   */
  public static final class InfoServiceBlockingStub
      extends io.grpc.stub.AbstractBlockingStub<InfoServiceBlockingStub> {
    private InfoServiceBlockingStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected InfoServiceBlockingStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new InfoServiceBlockingStub(channel, callOptions);
    }

    /**
     * <pre>
     * Returns the server's version, namespace, layout, held machine ids and
     * server time. With authentication on, a call without an API key gets only
     * the version and the server time (servers' peer clock checks read it).
     * </pre>
     */
    public dev.snowkeep.v1.GetInfoResponse getInfo(dev.snowkeep.v1.GetInfoRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getGetInfoMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Splits an id, given as a number or as its text (DecodeIdRequest.text),
     * into timestamp, machine id and sequence under the server's layout.
     * INVALID_ARGUMENT when the id is above the layout's largest,
     * 2^(timestamp_bits + machine_bits + sequence_bits) - 1, when both forms
     * are sent, or when the text is not an id of the layout.
     * </pre>
     */
    public dev.snowkeep.v1.DecodeIdResponse decodeId(dev.snowkeep.v1.DecodeIdRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getDecodeIdMethod(), getCallOptions(), request);
    }

    /**
     * <pre>
     * Counts the machine ids of the server's namespace range: total, held,
     * free. UNAVAILABLE when the store cannot be read.
     * </pre>
     */
    public dev.snowkeep.v1.Capacity getCapacity(dev.snowkeep.v1.GetCapacityRequest request) {
      return io.grpc.stub.ClientCalls.blockingUnaryCall(
          getChannel(), getGetCapacityMethod(), getCallOptions(), request);
    }
  }

  /**
   * A stub to allow clients to do ListenableFuture-style rpc calls to service InfoService.
   * <pre>
   * Describes the server: version, layout, held machine ids and fences, and
   * decodes ids.
   * </pre>
   */
  public static final class InfoServiceFutureStub
      extends io.grpc.stub.AbstractFutureStub<InfoServiceFutureStub> {
    private InfoServiceFutureStub(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      super(channel, callOptions);
    }

    @java.lang.Override
    protected InfoServiceFutureStub build(
        io.grpc.Channel channel, io.grpc.CallOptions callOptions) {
      return new InfoServiceFutureStub(channel, callOptions);
    }

    /**
     * <pre>
     * Returns the server's version, namespace, layout, held machine ids and
     * server time. With authentication on, a call without an API key gets only
     * the version and the server time (servers' peer clock checks read it).
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<dev.snowkeep.v1.GetInfoResponse> getInfo(
        dev.snowkeep.v1.GetInfoRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getGetInfoMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Splits an id, given as a number or as its text (DecodeIdRequest.text),
     * into timestamp, machine id and sequence under the server's layout.
     * INVALID_ARGUMENT when the id is above the layout's largest,
     * 2^(timestamp_bits + machine_bits + sequence_bits) - 1, when both forms
     * are sent, or when the text is not an id of the layout.
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<dev.snowkeep.v1.DecodeIdResponse> decodeId(
        dev.snowkeep.v1.DecodeIdRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getDecodeIdMethod(), getCallOptions()), request);
    }

    /**
     * <pre>
     * Counts the machine ids of the server's namespace range: total, held,
     * free. UNAVAILABLE when the store cannot be read.
     * </pre>
     */
    public com.google.common.util.concurrent.ListenableFuture<dev.snowkeep.v1.Capacity> getCapacity(
        dev.snowkeep.v1.GetCapacityRequest request) {
      return io.grpc.stub.ClientCalls.futureUnaryCall(
          getChannel().newCall(getGetCapacityMethod(), getCallOptions()), request);
    }
  }

  private static final int METHODID_GET_INFO = 0;
  private static final int METHODID_DECODE_ID = 1;
  private static final int METHODID_GET_CAPACITY = 2;

  private static final class MethodHandlers<Req, Resp> implements
      io.grpc.stub.ServerCalls.UnaryMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.ServerStreamingMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.ClientStreamingMethod<Req, Resp>,
      io.grpc.stub.ServerCalls.BidiStreamingMethod<Req, Resp> {
    private final AsyncService serviceImpl;
    private final int methodId;

    MethodHandlers(AsyncService serviceImpl, int methodId) {
      this.serviceImpl = serviceImpl;
      this.methodId = methodId;
    }

    @java.lang.Override
    @java.lang.SuppressWarnings("unchecked")
    public void invoke(Req request, io.grpc.stub.StreamObserver<Resp> responseObserver) {
      switch (methodId) {
        case METHODID_GET_INFO:
          serviceImpl.getInfo((dev.snowkeep.v1.GetInfoRequest) request,
              (io.grpc.stub.StreamObserver<dev.snowkeep.v1.GetInfoResponse>) responseObserver);
          break;
        case METHODID_DECODE_ID:
          serviceImpl.decodeId((dev.snowkeep.v1.DecodeIdRequest) request,
              (io.grpc.stub.StreamObserver<dev.snowkeep.v1.DecodeIdResponse>) responseObserver);
          break;
        case METHODID_GET_CAPACITY:
          serviceImpl.getCapacity((dev.snowkeep.v1.GetCapacityRequest) request,
              (io.grpc.stub.StreamObserver<dev.snowkeep.v1.Capacity>) responseObserver);
          break;
        default:
          throw new AssertionError();
      }
    }

    @java.lang.Override
    @java.lang.SuppressWarnings("unchecked")
    public io.grpc.stub.StreamObserver<Req> invoke(
        io.grpc.stub.StreamObserver<Resp> responseObserver) {
      switch (methodId) {
        default:
          throw new AssertionError();
      }
    }
  }

  public static final io.grpc.ServerServiceDefinition bindService(AsyncService service) {
    return io.grpc.ServerServiceDefinition.builder(getServiceDescriptor())
        .addMethod(
          getGetInfoMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              dev.snowkeep.v1.GetInfoRequest,
              dev.snowkeep.v1.GetInfoResponse>(
                service, METHODID_GET_INFO)))
        .addMethod(
          getDecodeIdMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              dev.snowkeep.v1.DecodeIdRequest,
              dev.snowkeep.v1.DecodeIdResponse>(
                service, METHODID_DECODE_ID)))
        .addMethod(
          getGetCapacityMethod(),
          io.grpc.stub.ServerCalls.asyncUnaryCall(
            new MethodHandlers<
              dev.snowkeep.v1.GetCapacityRequest,
              dev.snowkeep.v1.Capacity>(
                service, METHODID_GET_CAPACITY)))
        .build();
  }

  private static abstract class InfoServiceBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoFileDescriptorSupplier, io.grpc.protobuf.ProtoServiceDescriptorSupplier {
    InfoServiceBaseDescriptorSupplier() {}

    @java.lang.Override
    public com.google.protobuf.Descriptors.FileDescriptor getFileDescriptor() {
      return dev.snowkeep.v1.InfoProto.getDescriptor();
    }

    @java.lang.Override
    public com.google.protobuf.Descriptors.ServiceDescriptor getServiceDescriptor() {
      return getFileDescriptor().findServiceByName("InfoService");
    }
  }

  private static final class InfoServiceFileDescriptorSupplier
      extends InfoServiceBaseDescriptorSupplier {
    InfoServiceFileDescriptorSupplier() {}
  }

  private static final class InfoServiceMethodDescriptorSupplier
      extends InfoServiceBaseDescriptorSupplier
      implements io.grpc.protobuf.ProtoMethodDescriptorSupplier {
    private final java.lang.String methodName;

    InfoServiceMethodDescriptorSupplier(java.lang.String methodName) {
      this.methodName = methodName;
    }

    @java.lang.Override
    public com.google.protobuf.Descriptors.MethodDescriptor getMethodDescriptor() {
      return getServiceDescriptor().findMethodByName(methodName);
    }
  }

  private static volatile io.grpc.ServiceDescriptor serviceDescriptor;

  public static io.grpc.ServiceDescriptor getServiceDescriptor() {
    io.grpc.ServiceDescriptor result = serviceDescriptor;
    if (result == null) {
      synchronized (InfoServiceGrpc.class) {
        result = serviceDescriptor;
        if (result == null) {
          serviceDescriptor = result = io.grpc.ServiceDescriptor.newBuilder(SERVICE_NAME)
              .setSchemaDescriptor(new InfoServiceFileDescriptorSupplier())
              .addMethod(getGetInfoMethod())
              .addMethod(getDecodeIdMethod())
              .addMethod(getGetCapacityMethod())
              .build();
        }
      }
    }
    return result;
  }
}
